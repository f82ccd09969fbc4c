#include "infer/decoder.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace jtok {

namespace {

// The CPU engine: a KVCache a sequence, the free functions of infer/generate.h on them.
class CpuDecoder final : public Decoder {
 public:
  CpuDecoder(const Model& m, bool kv_bf16) : m_(m), kv_bf16_(kv_bf16) {}
  std::string describe() const override { return "cpu"; }

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
  KVCache* host_cache(int64_t seq) override { return &slot(seq).cache; }
  bool has_host_caches() const override { return true; }

 private:
  struct Slot {
    int64_t capacity = 0;
    KVCache cache;
  };
  Slot& slot(int64_t seq) const {
    if (seq < 0 || seq >= static_cast<int64_t>(slots_.size()) || !slots_[static_cast<size_t>(seq)])
      fail("Decoder: no open sequence ", seq);
    return *slots_[static_cast<size_t>(seq)];
  }
  const Model& m_;
  bool kv_bf16_;
  std::vector<std::unique_ptr<Slot>> slots_;  // null: a closed handle (its cache freed); stable addresses
};

// cuda::DeviceDecoder as a Decoder: prompts longer than max_prefill go in pieces of at most that
// many, steps of more than max_batch sequences in groups of at most that many.
class DeviceDecoderAdapter final : public Decoder {
 public:
  DeviceDecoderAdapter(const Model& m, std::unique_ptr<cuda::DeviceDecoder> d, const cuda::DecoderSettings& s)
      : V_(m.cfg.vocab_size), d_(std::move(d)), max_prefill_(std::max<int64_t>(1, s.max_prefill)),
        max_batch_(std::max<int64_t>(1, s.max_batch)) {}
  std::string describe() const override { return d_->describe(); }
  cuda::StepBreakdown last_step() const override { return d_->last_step(); }
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
  int64_t decode(const int64_t* seqs, const int32_t* tokens, int64_t M, float* logits) override {
    int64_t rows = 0;
    for (int64_t at = 0; at < M; at += max_batch_)
      rows += d_->decode(seqs + at, tokens + at, std::min(max_batch_, M - at), logits + at * V_);
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
