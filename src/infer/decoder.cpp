#include "infer/decoder.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <utility>

#include "core/error.h"

namespace jtok {

namespace {

// pick() run, its host seconds added to pick_s: every engine's decode_pick times its picking so
// (Decoder::pick_seconds).
template <class F>
void timed_pick(double& pick_s, F&& pick) {
  const auto t0 = std::chrono::steady_clock::now();
  std::forward<F>(pick)();
  pick_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int64_t Decoder::decode_pick(const int64_t* seqs, const int32_t* tokens, int64_t M, const PickRequest* req,
                             TokenPick* out) {
  const int64_t V = vocab_size();
  pick_logits_.resize(static_cast<size_t>(M * V));
  const int64_t rows = decode(seqs, tokens, M, pick_logits_.data());
  timed_pick(pick_s_, [&] {
    for (int64_t i = 0; i < M; ++i) out[i] = pick_from_row(pick_logits_.data() + i * V, V, req[i]);
  });
  return rows;
}

namespace {

// The CPU engine: a KVCache a sequence, the free functions of infer/generate.h on them.
class CpuDecoder final : public Decoder {
 public:
  CpuDecoder(const Model& m, bool kv_bf16) : m_(m), kv_bf16_(kv_bf16) {}
  std::string describe() const override { return "cpu"; }
  int64_t vocab_size() const override { return m_.cfg.vocab_size; }

  int64_t open(int64_t capacity) override {
    if (capacity < 1) fail("Decoder::open: capacity must be at least 1 position, got ", capacity);
    size_t h = 0;  // the lowest closed handle, else a new one
    while (h < slots_.size() && slots_[h]) ++h;
    if (h == slots_.size()) slots_.emplace_back();
    slots_[h] = std::make_unique<Slot>();
    slots_[h]->capacity = capacity;
    slots_[h]->cache.bf16 = kv_bf16_;
    return static_cast<int64_t>(h);
  }
  void close(int64_t seq) override {
    slot(seq);  // a bad handle fails
    slots_[static_cast<size_t>(seq)].reset();
  }
  // A copy of seq's cache; a capacity other than seq's resizes each layer's arrays (positions are
  // the outer dimension, so the first len stay where they are).
  int64_t fork(int64_t seq, int64_t capacity) override {
    const Slot& src = slot(seq);
    if (capacity < src.cache.len)
      fail("Decoder::fork: capacity ", capacity, " is below the sequence's ", src.cache.len, " positions");
    KVCache copy = src.cache;
    const int64_t h = open(capacity);
    if (copy.layers() > 0 && copy.capacity != capacity) {
      const size_t n = static_cast<size_t>(capacity * m_.cfg.kv_dim());
      for (auto& a : copy.k) a.resize(n);
      for (auto& a : copy.v) a.resize(n);
      for (auto& a : copy.k16) a.resize(n);
      for (auto& a : copy.v16) a.resize(n);
      copy.capacity = capacity;
    }
    slots_[static_cast<size_t>(h)]->cache = std::move(copy);
    return h;
  }
  int64_t length(int64_t seq) const override { return slot(seq).cache.len; }
  int64_t capacity(int64_t seq) const override { return slot(seq).capacity; }

  std::vector<float> prefill(int64_t seq, const int32_t* tokens, int64_t n, const PositionLogits& each) override {
    Slot& s = slot(seq);
    if (s.cache.len > 0) return prefill_chunk(m_, s.cache, tokens, n, nullptr, each);
    s.cache.bf16 = kv_bf16_;  // also after a caller reset the cache (KVCache{})
    return jtok::prefill(m_, s.cache, std::vector<int32_t>(tokens, tokens + n), s.capacity, each);
  }
  int64_t decode(const int64_t* seqs, const int32_t* tokens, int64_t M, float* logits) override {
    std::vector<KVCache*> caches(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) caches[static_cast<size_t>(i)] = &slot(seqs[i]).cache;
    return decode_batch(m_, caches.data(), tokens, M, logits);
  }
  int64_t keep_block(int64_t seq, int64_t first, int64_t n) override;
  void drop_block(int64_t block) override {
    block_at(block);  // a bad handle fails
    blocks_[static_cast<size_t>(block)].reset();
  }
  int64_t open_from_blocks(const std::vector<int64_t>& blocks, int64_t capacity) override;
  KVCache* host_cache(int64_t seq) override { return &slot(seq).cache; }

 private:
  struct Slot {
    int64_t capacity = 0;
    KVCache cache;
  };
  // A kept block: (layers, 2, n, kv_dim), K then V of each layer, in the cache's dtype.
  struct Block {
    int64_t n = 0;
    std::vector<float> kv;
    std::vector<uint16_t> kv16;
  };
  const Block& block_at(int64_t block) const {
    if (block < 0 || block >= static_cast<int64_t>(blocks_.size()) || !blocks_[static_cast<size_t>(block)])
      fail("Decoder: no stored block ", block);
    return *blocks_[static_cast<size_t>(block)];
  }
  Slot& slot(int64_t seq) const {
    if (seq < 0 || seq >= static_cast<int64_t>(slots_.size()) || !slots_[static_cast<size_t>(seq)])
      fail("Decoder: no open sequence ", seq);
    return *slots_[static_cast<size_t>(seq)];
  }
  const Model& m_;
  bool kv_bf16_;
  std::vector<std::unique_ptr<Slot>> slots_;  // null: a closed handle (its cache freed); stable addresses
  std::vector<std::unique_ptr<Block>> blocks_;  // null: a dropped handle
};

// Copies of the values: one layer's K (or V) of the block is n * kv_dim values at position first.
int64_t CpuDecoder::keep_block(int64_t seq, int64_t first, int64_t n) {
  const KVCache& c = slot(seq).cache;
  if (first < 0 || n < 1 || first + n > c.len)
    fail("Decoder::keep_block: positions [", first, ", ", first + n, ") of sequence ", seq, " (", c.len, " written)");
  auto b = std::make_unique<Block>();
  b->n = n;
  const int64_t L = static_cast<int64_t>(c.layers()), w = n * m_.cfg.kv_dim();
  const size_t at = static_cast<size_t>(first * m_.cfg.kv_dim());
  if (c.bf16) b->kv16.resize(static_cast<size_t>(L * 2 * w));
  else b->kv.resize(static_cast<size_t>(L * 2 * w));
  for (int64_t l = 0; l < L; ++l) {
    if (c.bf16) {
      std::memcpy(b->kv16.data() + l * 2 * w, c.k16[l].data() + at, sizeof(uint16_t) * w);
      std::memcpy(b->kv16.data() + l * 2 * w + w, c.v16[l].data() + at, sizeof(uint16_t) * w);
    } else {
      std::memcpy(b->kv.data() + l * 2 * w, c.k[l].data() + at, sizeof(float) * w);
      std::memcpy(b->kv.data() + l * 2 * w + w, c.v[l].data() + at, sizeof(float) * w);
    }
  }
  size_t h = 0;  // the lowest dropped handle, else a new one
  while (h < blocks_.size() && blocks_[h]) ++h;
  if (h == blocks_.size()) blocks_.emplace_back();
  blocks_[h] = std::move(b);
  return static_cast<int64_t>(h);
}

// A cache allocated for capacity (kv_allocate, as prefill's), the blocks copied in one after another.
int64_t CpuDecoder::open_from_blocks(const std::vector<int64_t>& blocks, int64_t capacity) {
  int64_t len = 0;
  for (int64_t id : blocks) len += block_at(id).n;
  if (len > capacity) fail("Decoder::open_from_blocks: ", len, " positions do not fit a capacity of ", capacity);
  KVCache c;
  c.bf16 = kv_bf16_;
  const auto L = static_cast<int64_t>(m_.w.layers.size());
  kv_allocate(c, static_cast<size_t>(L), m_.cfg.kv_dim(), capacity);
  for (int64_t id : blocks) {
    const Block& b = block_at(id);
    const int64_t w = b.n * m_.cfg.kv_dim();
    const size_t at = static_cast<size_t>(c.len * m_.cfg.kv_dim());
    for (int64_t l = 0; l < L; ++l) {
      if (c.bf16) {
        std::memcpy(c.k16[l].data() + at, b.kv16.data() + l * 2 * w, sizeof(uint16_t) * w);
        std::memcpy(c.v16[l].data() + at, b.kv16.data() + l * 2 * w + w, sizeof(uint16_t) * w);
      } else {
        std::memcpy(c.k[l].data() + at, b.kv.data() + l * 2 * w, sizeof(float) * w);
        std::memcpy(c.v[l].data() + at, b.kv.data() + l * 2 * w + w, sizeof(float) * w);
      }
    }
    c.len += b.n;
  }
  const int64_t h = open(capacity);
  slots_[static_cast<size_t>(h)]->cache = std::move(c);
  return h;
}

// cuda::DeviceDecoder as a Decoder: prompts longer than max_prefill go in pieces of at most that
// many, steps of more than max_batch sequences in groups of at most that many.
class DeviceDecoderAdapter final : public Decoder {
 public:
  DeviceDecoderAdapter(const Model& m, std::unique_ptr<cuda::DeviceDecoder> d, const cuda::DecoderSettings& s)
      : V_(m.cfg.vocab_size), d_(std::move(d)), max_prefill_(std::max<int64_t>(1, s.max_prefill)),
        max_batch_(std::max<int64_t>(1, s.max_batch)) {}
  std::string describe() const override { return d_->describe(); }
  int64_t vocab_size() const override { return V_; }
  cuda::StepBreakdown last_step() const override { return d_->last_step(); }
  int64_t last_graph_kernels() const override { return d_->last_graph_kernels(); }
  int64_t last_graph_pdl_edges() const override { return d_->last_graph_pdl_edges(); }
  int64_t open(int64_t capacity) override {
    const int64_t h = d_->open(capacity);
    capacity_[h] = capacity;
    return h;
  }
  void close(int64_t seq) override {
    d_->close(seq);
    capacity_.erase(seq);
  }
  int64_t fork(int64_t seq, int64_t capacity) override {
    const int64_t h = d_->fork(seq, capacity);
    capacity_[h] = capacity;
    return h;
  }
  int64_t length(int64_t seq) const override { return d_->length(seq); }
  int64_t capacity(int64_t seq) const override {
    const auto it = capacity_.find(seq);
    if (it == capacity_.end()) fail("Decoder: no open sequence ", seq);
    return it->second;
  }
  std::vector<float> prefill(int64_t seq, const int32_t* tokens, int64_t n, const PositionLogits& each) override {
    if (n < 1) fail("Decoder::prefill: no tokens");
    std::vector<float> last(static_cast<size_t>(V_));
    for (int64_t at = 0; at < n; at += max_prefill_)
      d_->prefill(seq, tokens + at, std::min(max_prefill_, n - at), last.data(), each);
    return last;
  }
  int64_t keep_block(int64_t seq, int64_t first, int64_t n) override { return d_->keep_block(seq, first, n); }
  void drop_block(int64_t block) override { d_->drop_block(block); }
  int64_t open_from_blocks(const std::vector<int64_t>& blocks, int64_t capacity) override {
    const int64_t h = d_->open_from_blocks(blocks, capacity);
    capacity_[h] = capacity;
    return h;
  }
  int64_t block_granule() const override { return d_->page_tokens(); }
  bool blocks_shared() const override { return true; }
  int64_t decode(const int64_t* seqs, const int32_t* tokens, int64_t M, float* logits) override {
    int64_t rows = 0;
    for (int64_t at = 0; at < M; at += max_batch_)
      rows += d_->decode(seqs + at, tokens + at, std::min(max_batch_, M - at), logits + at * V_);
    return rows;
  }
  // A group of at most max_batch rows a step: its rows' draws first (digest_rows), the step's
  // digests, the picks, a row's logits copied back where its digest does not settle it (valid until
  // the group's next step).
  int64_t decode_pick(const int64_t* seqs, const int32_t* tokens, int64_t M, const PickRequest* req,
                      TokenPick* out) override {
    int64_t rows = 0;
    std::vector<cuda::DigestRow> in(static_cast<size_t>(std::min(max_batch_, M)));
    std::vector<cuda::LogitDigest> digests(in.size());
    for (int64_t at = 0; at < M; at += max_batch_) {
      const int64_t n = std::min(max_batch_, M - at);
      digest_rows(req + at, n, in.data());
      rows += d_->decode_digest(seqs + at, tokens + at, n, in.data(), digests.data());
      const RowSource copy_back = [&](int64_t i, float* row) { d_->copy_row_logits(i, row); };
      timed_pick(pick_s_, [&] { pick_rows(digests.data(), n, V_, req + at, out + at, copy_back); });
    }
    return rows;
  }

 private:
  int64_t V_;
  std::unique_ptr<cuda::DeviceDecoder> d_;
  int64_t max_prefill_, max_batch_;
  std::map<int64_t, int64_t> capacity_;  // handle -> positions it has room for
};

}  // namespace

std::unique_ptr<Decoder> make_cpu_decoder(const Model& m, bool kv_bf16) {
  return std::make_unique<CpuDecoder>(m, kv_bf16);
}

std::unique_ptr<Decoder> make_decoder(const Model& m, const std::string& device, const cuda::DecoderSettings& s) {
  if (device == "cpu") return make_cpu_decoder(m, s.kv_bf16);
  if (device == "cuda") return std::make_unique<DeviceDecoderAdapter>(m, cuda::make_device_decoder(m, s), s);
  fail("--device must be cpu or cuda, got '", device, "'");
}

}  // namespace jtok
