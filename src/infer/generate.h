// Inference with a KV cache: prefill a prompt, then decode one token at a time.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/transformer.h"

namespace jtok {

// Keys (after RoPE) and values of every layer for one sequence: (Tmax, KV, hd) each, in fp32 or,
// with bf16 set before prefill, rounded to bf16 (nearest even): half the bytes a decoding step reads
// from the cache (llama.cpp keeps its cache in f16 by default), at a relative error <= 2^-9 per
// stored value. The f32 cache is exact: the decode equals the full forward up to fp32 summation order.
struct KVCache {
  int64_t len = 0, capacity = 0;
  bool bf16 = false;
  std::vector<std::vector<float>> k, v;        // per layer (f32 cache)
  std::vector<std::vector<uint16_t>> k16, v16;  // per layer (bf16 cache)
  size_t layers() const { return bf16 ? k16.size() : k.size(); }
};
// Sizes cache for `capacity` positions of `layers` layers of kv_dim values each (zeroed, in the dtype
// cache.bf16 says); len = 0. What prefill does first; the serving engine's prefix reuse too.
void kv_allocate(KVCache& cache, size_t layers, int64_t kv_dim, int64_t capacity);
// The dtypes a KV cache can hold (parse_dtype's `allowed` for --kv-dtype).
inline constexpr std::initializer_list<Dtype> kKvDtypes = {Dtype::f32, Dtype::bf16};

// The logits (n, vocab_size) of prompt positions pos..pos+n-1 (row r predicts the token after
// position pos + r), handed over in blocks by prefill / prefill_chunk when asked: the log-probs of a
// prompt's own tokens (/v1/completions echo). Each row by the per-row kernels (its bits do not
// depend on the block), from the same final hidden states as the returned last-position logits.
using PositionLogits = std::function<void(int64_t pos, int64_t n, const float* logits)>;

// Runs the prompt (all positions at once) and fills the cache; returns the last position's
// logits over the real vocabulary. each (optional): every position's logits, as above.
std::vector<float> prefill(const Model& m, KVCache& cache, const std::vector<int32_t>& prompt, int64_t capacity,
                           const PositionLogits& each = {});
// Continues a prefill: appends tokens[0..n) at positions cache.len.. (the cache already holds the
// prompt's start, from prefill; capacity as prefill gave it). Every matrix product takes the n rows
// at once; each row attends over the cache up to itself. Returns the last token's logits; rows_read
// (optional) gets the token-table rows read. The same logits as a one-shot prefill of the whole
// prompt up to float rounding (another attention kernel, another summation order; tested within
// 1e-4 of the largest logit, tests/test_generate.cpp).
std::vector<float> prefill_chunk(const Model& m, KVCache& cache, const int32_t* tokens, int64_t n,
                                 int64_t* rows_read = nullptr, const PositionLogits& each = {});
// prefill of the first `chunk` tokens, then prefill_chunk of at most `chunk` tokens at a time: what
// the server does with --prefill-chunk (there with decode steps of other sequences in between).
// chunk >= prompt size is prefill itself.
std::vector<float> prefill_chunked(const Model& m, KVCache& cache, const std::vector<int32_t>& prompt, int64_t capacity,
                                   int64_t chunk);
// Appends one token at position cache.len; returns its logits over the real vocabulary.
// decode_batch with one sequence.
std::vector<float> decode_step(const Model& m, KVCache& cache, int32_t token);
// One decode step of M sequences together (continuous batching): tokens[i] is appended at position
// caches[i]->len of sequence i, and logits (M, vocab_size) gets each one's next-token logits over the
// real vocabulary. Every matrix product of the backbone (attention projections, MLP / MoE, LM head)
// takes the M rows at once; attention reads each sequence's own cache; JTok / JTok-M rows are
// gathered once per distinct id of the step. Sequences may sit at different positions. Batch
// invariant: each sequence's logits have the same bits as when it is decoded alone (decode_step),
// whatever M and the other sequences (every product by the per-row kernels, RowKernel::per_row).
// Returns the token-table rows read (JTok: one per distinct id and layer; JTok-M: one per distinct
// (id, selected table) pair and layer).
int64_t decode_batch(const Model& m, KVCache* const* caches, const int32_t* tokens, int64_t M, float* logits);

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
};
// Picks the next token from logits; ties in greedy go to the lowest id.
int32_t sample_token(const std::vector<float>& logits, const SamplingParams& p, std::mt19937_64& rng);
// The same from a row of V logits where it lies (the serving engine's picks: no copy of the row).
int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, std::mt19937_64& rng);

}  // namespace jtok
