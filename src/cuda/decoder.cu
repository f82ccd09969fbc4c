// The GPU decoder (src/cuda/decoder.h): sequences as KV page tables (cuda/kv_pages.h), a prefill or
// a decode step as one forward over its rows (cuda/decoder_forward.cu), the logits copied back.
// A capacity past the model's context (its RoPE table's positions) is cut to it, as the CPU's
// prefill cuts it. The host Model must outlive the decoder: its tables are read where they lie.
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "cuda/decoder_state.h"
#include "cuda/model_kernels.h"
#include "model/token_table.h"

namespace jtok::cuda {

namespace {

template <typename E>
class GpuDecoder final : public DeviceDecoder {
 public:
  GpuDecoder(const Model& host, const DecoderSettings& s) { setup_decoder(st_, host, s); }
  ~GpuDecoder() override { cudaStreamSynchronize(st_.s()); }  // nothing in flight while the buffers go

  std::string describe() const override { return describe_decoder(st_); }
  int64_t open(int64_t capacity) override;
  void close(int64_t seq) override { st_.kv.pages->close(seq); }
  int64_t fork(int64_t seq, int64_t capacity) override;
  int64_t length(int64_t seq) const override { return st_.kv.pages->length(seq); }
  // Bookkeeping only: a block is its pages, whose contents the queued steps have written or will.
  int64_t keep_block(int64_t seq, int64_t first, int64_t n) override { return st_.kv.pages->keep(seq, first, n); }
  void drop_block(int64_t block) override { st_.kv.pages->drop(block); }
  int64_t open_from_blocks(const std::vector<int64_t>& blocks, int64_t capacity) override;
  int64_t page_tokens() const override { return st_.kv.page_tokens; }
  int64_t free_pages() const override { return st_.kv.pages->free_pages(); }
  void prefill(int64_t seq, const int32_t* tokens, int64_t n, float* last_logits, const RowLogits& each) override;
  int64_t decode(const int64_t* seqs, const int32_t* tokens, int64_t M, float* logits) override;
  int64_t decode_digest(const int64_t* seqs, const int32_t* tokens, int64_t M, const DigestRow* rows,
                        LogitDigest* out) override;
  void copy_row_logits(int64_t i, float* out) override;
  StepBreakdown last_step() const override { return st_.last_step; }
  int64_t last_graph_kernels() const override { return st_.last_graph_kernels; }
  int64_t last_graph_pdl_edges() const override { return st_.last_graph_pdl_edges; }

 private:
  int64_t context_cut(int64_t capacity) const;
  void upload_page_row(int64_t seq);
  void copy_pages(const std::vector<std::pair<int32_t, int32_t>>& copies);
  void check_room(int64_t seq, int64_t n) const;
  void upload_step(const int32_t* tokens, int64_t R, int64_t seq, int64_t pos0);
  void prefill_each(int64_t pos0, int64_t n, float* last_logits, const RowLogits& each);
  // After a sync that follows the step: a staged gather's error (StepRows::check_error) fails it.
  void check_rows() {
    if (st_.rows) st_.rows->check_error();
  }
  int64_t rows_read(const int32_t* tokens, int64_t M) const;
  int64_t check_decode(const int64_t* seqs, int64_t M) const;

  DecoderState<E> st_;
  int64_t digest_rows_ = 0;  // rows of the last step whose logits acts.logits holds (a decode_digest's)
};

template <typename E>
int64_t GpuDecoder<E>::context_cut(int64_t capacity) const {
  if (capacity < 1) fail("cuda decoder: a sequence of capacity ", capacity, " (at least 1 position)");
  return std::min(capacity, st_.rope_T);
}

// seq's row of the page tables (its pages, zeros after) on the device, behind the queued work.
template <typename E>
void GpuDecoder<E>::upload_page_row(int64_t seq) {
  DecoderKv& kv = st_.kv;
  const std::vector<int32_t>& pages = kv.pages->pages(seq);
  JTOK_CHECK(static_cast<int64_t>(pages.size()) <= kv.max_pages, "cuda decoder: sequence ", seq, " holds ",
             pages.size(), " pages, its page table room ", kv.max_pages);
  int32_t* row = kv.tables_host.data() + seq * kv.max_pages;
  std::fill(row, row + kv.max_pages, 0);
  std::copy(pages.begin(), pages.end(), row);
  JTOK_CUDA_CHECK(cudaMemcpyAsync(kv.tables.get() + seq * kv.max_pages, row,
                                  static_cast<size_t>(kv.max_pages) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  st_.s()));
}

template <typename E>
int64_t GpuDecoder<E>::open(int64_t capacity) {
  const int64_t seq = st_.kv.pages->open(context_cut(capacity));
  upload_page_row(seq);
  return seq;
}

// Every layer's K and V page src copied to page dst.
template <typename E>
void GpuDecoder<E>::copy_pages(const std::vector<std::pair<int32_t, int32_t>>& copies) {
  const DecoderKv& kv = st_.kv;
  const size_t page = kv.page_bytes();
  for (int64_t l = 0; l < kv.layers; ++l) {
    const PagedKv layer = kv.layer(l);
    for (void* pool : {layer.k, layer.v}) {
      uint8_t* base = static_cast<uint8_t*>(pool);
      for (const auto& [src, dst] : copies)
        JTOK_CUDA_CHECK(cudaMemcpyAsync(base + static_cast<size_t>(dst) * page, base + static_cast<size_t>(src) * page,
                                        page, cudaMemcpyDeviceToDevice, st_.s()));
    }
  }
}

template <typename E>
int64_t GpuDecoder<E>::fork(int64_t seq, int64_t capacity) {
  std::vector<std::pair<int32_t, int32_t>> copies;
  const int64_t child = st_.kv.pages->fork(seq, context_cut(capacity), copies);
  upload_page_row(child);
  copy_pages(copies);
  return child;
}

// The blocks' pages first in the new sequence's page-table row, its own pages after them.
template <typename E>
int64_t GpuDecoder<E>::open_from_blocks(const std::vector<int64_t>& blocks, int64_t capacity) {
  const int64_t seq = st_.kv.pages->open_from(blocks, context_cut(capacity));
  upload_page_row(seq);
  return seq;
}

template <typename E>
void GpuDecoder<E>::check_room(int64_t seq, int64_t n) const {
  const KvPages& p = *st_.kv.pages;
  if (!p.is_open(seq)) fail("cuda decoder: sequence ", seq, " is not open");
  if (p.length(seq) + n > p.capacity(seq))
    fail("cuda decoder: sequence ", seq, " holds ", p.length(seq), " of its ", p.capacity(seq), " positions: ", n,
         " more do not fit");
}

// A prefill's ids, page-table rows and positions up in one copy: row r is sequence seq at pos0 + r
// (a decode's: cuda/decoder_step.cu).
template <typename E>
void GpuDecoder<E>::upload_step(const int32_t* tokens, int64_t R, int64_t seq, int64_t pos0) {
  check_ids(tokens, R, st_.cfg.vocab_size, "token");
  DecoderActs<E>& A = st_.acts;
  // Idle but for an open's or a fork's copies (a step ends in a sync; one that threw may not have):
  // the previous copy out of host_step is done before it is rewritten.
  JTOK_CUDA_CHECK(cudaStreamSynchronize(st_.s()));
  int32_t* h = A.host_step.get();
  const int64_t n = A.max_rows;
  for (int64_t r = 0; r < R; ++r) {
    h[r] = tokens[r];
    h[n + r] = static_cast<int32_t>(seq);
    h[2 * n + r] = static_cast<int32_t>(pos0 + r);
  }
  JTOK_CUDA_CHECK(cudaMemcpyAsync(A.step.get(), h, static_cast<size_t>(3 * n) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, st_.s()));
}

template <typename E>
void GpuDecoder<E>::prefill(int64_t seq, const int32_t* tokens, int64_t n, float* last_logits, const RowLogits& each) {
  if (n < 1 || n > st_.settings.max_prefill)
    fail("cuda decoder: a prefill of ", n, " tokens (1 to max_prefill ", st_.settings.max_prefill, ")");
  check_room(seq, n);
  digest_rows_ = 0;  // the head's logits are the prefill's from now on
  const int64_t pos0 = st_.kv.pages->length(seq), V = st_.cfg.vocab_size;
  upload_step(tokens, n, seq, pos0);
  forward_rows(st_, tokens, StepShape{n, pos0 == 0, pos0 + n, false});
  if (each) {
    prefill_each(pos0, n, last_logits, each);
  } else {
    head_logits(st_, n - 1, 1);
    check_rows();
    if (last_logits) std::memcpy(last_logits, st_.acts.host_logits.get(), static_cast<size_t>(V) * sizeof(float));
  }
  st_.kv.pages->advance(seq, n);
}

// Every row's logits in blocks of head_rows, handed to `each`; the last row's into last_logits (the
// same bits as the block's).
template <typename E>
void GpuDecoder<E>::prefill_each(int64_t pos0, int64_t n, float* last_logits, const RowLogits& each) {
  const int64_t V = st_.cfg.vocab_size, block = st_.acts.head_rows;
  for (int64_t r = 0; r < n; r += block) {
    const int64_t nb = std::min(block, n - r);
    head_logits(st_, r, nb);
    check_rows();
    const float* got = st_.acts.host_logits.get();
    if (r + nb == n && last_logits)
      std::memcpy(last_logits, got + (nb - 1) * V, static_cast<size_t>(V) * sizeof(float));
    each(pos0 + r, nb, got);
  }
}

// A decode step's checks (M in 1..max_batch, distinct open sequences with room): the longest row's
// positions after it.
template <typename E>
int64_t GpuDecoder<E>::check_decode(const int64_t* seqs, int64_t M) const {
  if (M > st_.settings.max_batch)
    fail("cuda decoder: a decode step of ", M, " sequences (max_batch ", st_.settings.max_batch, ")");
  int64_t max_len = 0;
  for (int64_t i = 0; i < M; ++i) {
    check_room(seqs[i], 1);
    for (int64_t j = 0; j < i; ++j)
      if (seqs[j] == seqs[i]) fail("cuda decoder: decode row ", i, " repeats sequence ", seqs[i], " of row ", j);
    max_len = std::max(max_len, st_.kv.pages->length(seqs[i]) + 1);
  }
  return max_len;
}

template <typename E>
int64_t GpuDecoder<E>::decode(const int64_t* seqs, const int32_t* tokens, int64_t M, float* logits) {
  if (M <= 0) return 0;
  const int64_t max_len = check_decode(seqs, M);
  digest_rows_ = 0;
  decode_step(st_, seqs, tokens, M, max_len);  // padded to its bucket, eager or a graph (decoder_step.cu)
  std::memcpy(logits, st_.acts.host_logits.get(), static_cast<size_t>(M * st_.cfg.vocab_size) * sizeof(float));
  for (int64_t i = 0; i < M; ++i) st_.kv.pages->advance(seqs[i], 1);
  return rows_read(tokens, M);
}

template <typename E>
int64_t GpuDecoder<E>::decode_digest(const int64_t* seqs, const int32_t* tokens, int64_t M, const DigestRow* rows,
                                     LogitDigest* out) {
  if (M <= 0) return 0;
  const int64_t max_len = check_decode(seqs, M);
  digest_rows_ = 0;
  decode_step(st_, seqs, tokens, M, max_len, rows);  // the digests in acts.host_digests, the logits kept
  std::memcpy(out, st_.acts.host_digests.get(), static_cast<size_t>(M) * sizeof(LogitDigest));
  digest_rows_ = M;
  for (int64_t i = 0; i < M; ++i) st_.kv.pages->advance(seqs[i], 1);
  return rows_read(tokens, M);
}

// Row i's real columns from acts.logits (the last decode_digest's head) through pinned host_logits.
template <typename E>
void GpuDecoder<E>::copy_row_logits(int64_t i, float* out) {
  if (i < 0 || i >= digest_rows_)
    fail("cuda decoder: copy_row_logits of row ", i, ": the last decode_digest's rows are 0..", digest_rows_ - 1,
         " (a decode or prefill since overwrote them)");
  const int64_t V = st_.cfg.vocab_size, Vp = st_.cfg.padded_vocab();
  float* pinned = st_.acts.host_logits.get();
  JTOK_CUDA_CHECK(cudaMemcpyAsync(pinned, st_.acts.logits.get() + i * Vp, static_cast<size_t>(V) * sizeof(float),
                                  cudaMemcpyDeviceToHost, st_.s()));
  JTOK_CUDA_CHECK(cudaStreamSynchronize(st_.s()));
  std::memcpy(out, pinned, static_cast<size_t>(V) * sizeof(float));
}

// As the CPU's decode_batch counts them: JTok, one row per distinct id and layer; JTok-M, one per
// distinct (id, selected table) pair and layer (the choices copied back by the forward, synced by
// the head). The GPU itself gathers every table's row of each distinct id (StepRows).
template <typename E>
int64_t GpuDecoder<E>::rows_read(const int32_t* tokens, int64_t M) const {
  if (!st_.rows) return 0;
  const RowBatch rb = jtok::dedup_ids(tokens, M, st_.cfg.padded_vocab());
  const int64_t U = static_cast<int64_t>(rb.unique.size()), ne = st_.cfg.jtokm_n_e, K = st_.cfg.jtokm_top_k;
  int64_t rows = 0;
  std::vector<uint8_t> seen;
  for (size_t l = 0; l < st_.w.layers.size(); ++l) {
    if (st_.w.layers[l].jtok_scale) rows += U;
    if (st_.sel_slot[l] < 0) continue;
    const int32_t* sel = st_.acts.host_sel.get() + st_.sel_slot[l] * st_.settings.max_batch * K;
    seen.assign(static_cast<size_t>(U * ne), 0);
    for (int64_t n = 0; n < M; ++n)
      for (int64_t k = 0; k < K; ++k) {
        uint8_t& s = seen[static_cast<size_t>(rb.inverse[static_cast<size_t>(n)] * ne + sel[n * K + k])];
        rows += s == 0;
        s = 1;
      }
  }
  return rows;
}

}  // namespace

std::unique_ptr<DeviceDecoder> make_device_decoder(const Model& host, const DecoderSettings& s) {
  require_cuda_device();          // its error, before the decoder's stream is made
  check_decoder_settings(host, s);  // and what it refuses
  if (s.bf16) return std::make_unique<GpuDecoder<__nv_bfloat16>>(host, s);
  return std::make_unique<GpuDecoder<float>>(host, s);
}

}  // namespace jtok::cuda
