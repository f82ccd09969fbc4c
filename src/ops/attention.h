// Causal grouped-query attention (docs/model.md): q head h reads kv head h / (H / KV).
// Inputs come straight from the projections, so no transposes: q (B,T,H,hd), k and v (B,T,KV,hd).
#pragma once
#include <cstdint>

namespace jtok {

// The fast kernels work in causal blocks of kAttnRowBlock query rows: rows [r0, r1) only see keys
// [0, r1), so the GEMMs skip the masked upper triangle except inside the diagonal block. The O(T)
// kernels also split the keys into blocks of kAttnKeyBlock (a multiple of the row block), so their
// scratch is one (kAttnRowBlock, kAttnKeyBlock) score block per thread whatever T is. Both sizes were
// chosen by timing the op alone on the bench configs (docs/benchmarks.md "Attention").
inline constexpr int64_t kAttnRowBlock = 64;
#ifndef JTOK_ATTN_KEY_BLOCK  // only bench/attention_op.cpp's block-size sweep sets it
#define JTOK_ATTN_KEY_BLOCK 512
#endif
inline constexpr int64_t kAttnKeyBlock = JTOK_ATTN_KEY_BLOCK;

// The default: O(T) memory (FlashAttention-2's algorithm). out (B,T,H,hd); lse (B,H,T) the row
// log-sum-exp of the scaled causal scores, all the backward keeps beside out (no T x T buffer).
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B, int64_t T,
                       int64_t H, int64_t KV, int64_t hd);
// dq (B,T,H,hd), dk, dv (B,T,KV,hd) are accumulated into (+=); each score block is recomputed from
// q, k and lse; out is the forward's output (for the row term sum_i dout out).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                        const float* q, const float* k, const float* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                        int64_t hd);

// At bf16 matmul precision (ops/linear.h: jtok train --precision bf16) the two above run these for
// even hd: the same algorithm with every block product bf16 x bf16 summed in fp32, as the layers'
// products at that precision (ops/attention_bf16.cpp). Callable directly at any precision.
void attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B,
                            int64_t T, int64_t H, int64_t KV, int64_t hd);
void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                             const float* q, const float* k, const float* v, int64_t B, int64_t T, int64_t H,
                             int64_t KV, int64_t hd);

// The previous fast kernels, kept as a reference and a peer in tests and benchmarks: probs
// (B,H,T,T) = causal softmax(q k^T / sqrt(hd)) kept for the backward (entries above the diagonal 0).
void attention_forward_probs(float* out, float* probs, const float* q, const float* k, const float* v, int64_t B,
                             int64_t T, int64_t H, int64_t KV, int64_t hd);
void attention_backward_probs(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                              const float* k, const float* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd);

// Plain double-precision references (probs as above).
// lse (optional): (B,H,T) as attention_forward's.
void attention_forward_ref(float* out, float* probs, const float* q, const float* k, const float* v, int64_t B,
                           int64_t T, int64_t H, int64_t KV, int64_t hd, float* lse = nullptr);
void attention_backward_ref(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                            const float* k, const float* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd);

// One query row against a cache (decoding): q (H,hd) at position t sees cached k, v (0..t) laid
// out (Tmax,KV,hd); out (H,hd). scratch holds H * (t+1) floats. The heads are split among the OpenMP
// threads unless called inside a parallel region (a batch of rows runs a row per thread instead).
void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache, int64_t t, int64_t H,
                      int64_t KV, int64_t hd, float* scratch);
// The same with the cache held as bf16 (KVCache::bf16): each value widened to fp32 as it is read.
void attention_decode_bf16(float* out, const float* q, const uint16_t* k_cache, const uint16_t* v_cache, int64_t t,
                           int64_t H, int64_t KV, int64_t hd, float* scratch);

}  // namespace jtok
