// The attention-input variants of imported backbones (docs/model.md "Variants"), applied to q, k, v
// right after their projections and before RoPE:
//   attention_bias (Qwen2): q += b_q, k += b_k, v += b_v
//   qk_norm (Qwen3):        q_h = RMSNorm(q_h) * g_q, k_h = RMSNorm(k_h) * g_k over each head's hd
// Both are per row, so a decode step's bits stay independent of the batch.
#pragma once
#include <cstdint>
#include <vector>

namespace jtok {

struct LayerView;

// What qk_norm's backward needs: q and k before the norm, and each head's 1/rms.
struct QkNormActs {
  std::vector<float> q_in, k_in;      // (N, H*hd), (N, KV*hd)
  std::vector<float> rstd_q, rstd_k;  // (N*H), (N*KV)
  std::vector<float> scratch;         // backward: the incoming gradient, copied
};

// q (N, H*hd), k and v (N, KV*hd) in place. save holds qk_norm's inputs (needed when W.q_norm is set).
void qkv_variants_forward(const LayerView& W, float* q, float* k, float* v, int64_t N, int64_t H, int64_t KV,
                          int64_t hd, float eps, QkNormActs& save);
// dq, dk, dv: gradients w.r.t. the variants' outputs (dq, dk after rope_backward), turned in place
// into gradients w.r.t. the projections' outputs; G's q_norm / k_norm gains and biases accumulate (+=).
void qkv_variants_backward(const LayerView& W, LayerView& G, float* dq, float* dk, const float* dv, QkNormActs& acts,
                           int64_t N, int64_t H, int64_t KV, int64_t hd);

}  // namespace jtok
