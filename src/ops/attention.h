// Causal grouped-query attention (docs/model.md): q head h reads kv head h / (H / KV).
// Inputs come straight from the projections, so no transposes: q (B,T,H,hd), k and v (B,T,KV,hd).
#pragma once
#include <cstdint>

namespace jtok {

// The fast forward and backward work in causal blocks of this many query rows: rows [r0, r1) only
// see keys [0, r1), so the GEMMs skip the masked upper triangle except inside the diagonal block.
// Chosen by timing the op alone on the bench configs (docs/benchmarks.md).
inline constexpr int64_t kAttnRowBlock = 64;

// out (B,T,H,hd); probs (B,H,T,T) = causal softmax(q k^T / sqrt(hd)), kept for the backward
// (entries above the diagonal are 0).
void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v, int64_t B,
                       int64_t T, int64_t H, int64_t KV, int64_t hd);
// dq (B,T,H,hd), dk, dv (B,T,KV,hd) are accumulated into (+=).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                        const float* k, const float* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd);

void attention_forward_ref(float* out, float* probs, const float* q, const float* k, const float* v, int64_t B,
                           int64_t T, int64_t H, int64_t KV, int64_t hd);
void attention_backward_ref(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                            const float* k, const float* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd);

// One query row against a cache (decoding): q (H,hd) at position t sees cached k, v (0..t) laid
// out (Tmax,KV,hd); out (H,hd). scratch holds t+1 floats.
void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache, int64_t t, int64_t H,
                      int64_t KV, int64_t hd, float* scratch);

}  // namespace jtok
