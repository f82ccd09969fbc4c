// Parameter and FLOPs accounting of a model shape (paper sections 3.1.2 and 3.6).
//
// N_c ("compute-intensive parameters") counts the attention q/k/v/o and MLP weights of every
// layer (activated experts only, for MoE: the shared experts and k routed experts of each MoE
// layer) and never the embedding, the LM head, token-indexed tables or the MoE router (d x E,
// tiny; counted in n_other and its FLOPs in flops_router, as the paper counts qkvo + MLP only). N_n counts the token-indexed table parameters (JTok: one padded_vocab x d table per
// layer; JTok-M: n_e of them per layer). eta = N_n / N_c, rho = K / n_e (1 for JTok alone).
//
// FLOPs conventions (written out in docs/scaling.md):
//   - a matmul (m x k) @ (k x n) costs 2*m*n*k FLOPs forward; backward costs 2x forward
//     (grad wrt input + grad wrt weight), so training = 3x forward;
//   - causal attention: per head, QK^T and AV are counted over the causal pairs only,
//     T(T+1)/2 per sequence (the model's useful work), each pair costing 2*hd FLOPs for QK^T
//     and 2*hd for AV. The engine's kernels compute the full T x T square (masked), so the
//     `_full_square` figures count T^2 pairs: use them for hardware utilisation (MFU), the
//     causal ones for the compute C of a scaling study;
//   - element-wise work (norms, RoPE, softmax, SiLU, residual adds, JTok gating) is not counted.
#pragma once
#include <cstdint>
#include <string>
#include <nlohmann/json.hpp>
#include "model/config.h"

namespace jtok {

// Token-indexed parameters attached to a backbone: JTok and JTok-M, each on some layers (both may
// be on). rho = K / n_e is JTok-M's when it is on, 1 for JTok alone.
struct TokenIndexedSpec {
  int64_t jtok_layers = 0;    // layers with a JTok table
  int64_t jtokm_layers = 0;   // layers with JTok-M
  int64_t n_e = 0;            // JTok-M tables per layer
  int64_t top_k = 0;          // JTok-M K
};

// What ModelConfig says about token-indexed parameters.
TokenIndexedSpec token_indexed_of(const ModelConfig& m);

struct FlopsReport {
  // Parameter counts.
  int64_t n_c = 0;                 // compute-intensive params: attention qkvo + MLP, all layers
  int64_t n_c_attention = 0;       //   of which attention q/k/v/o
  int64_t n_c_mlp = 0;             //   of which MLP (activated experts for MoE)
  int64_t n_n = 0;                 // token-indexed table params (0 without JTok)
  int64_t n_embedding = 0;         // embed_tokens: Vp x d
  int64_t n_lm_head = 0;           // Vp x d, 0 when tied to the embedding
  int64_t n_norms = 0;             // RMSNorm gains
  int64_t n_other = 0;             // JTok scalers, JTok-M and MoE routers (not in N_c)
  int64_t n_experts_inactive = 0;  // MoE: the routed experts a token does not use, (E - k) per MoE layer
  int64_t n_total = 0;             // every stored parameter (all experts)
  double eta = 0;                  // N_n / N_c
  double rho = 0;                  // K / n_e (0 when there are no token-indexed tables)
  // FLOPs per training token (forward + backward).
  int64_t seq_len = 0;
  double flops_6nc = 0;            // 6 N_c: the paper's C = 6 N_c D approximation
  double flops_lm_head = 0;        // 6 d Vp
  double flops_attention = 0;      // causal QK^T and AV: 3 * L * 2 * q_dim * (T+1)  (see above)
  double flops_router = 0;         // routers: JTok-M 6 * L * d * n_e, MoE 6 * L_moe * d * n_routed
  double flops_token_indexed = 0;  // JTok/JTok-M element-wise work (norm, scale, gate/mix)
  double flops_per_token = 0;      // exact: sum of the four above
  double flops_attention_full_square = 0;  // 3 * L * 4 * q_dim * T: QK^T and AV over all T^2 pairs
  double flops_per_token_full_square = 0;  // flops_per_token with the full-square attention
  double forward_flops_per_token = 0;  // flops_per_token / 3
};

// seq_len: the training sequence length T (attention cost depends on it).
FlopsReport flops_report(const ModelConfig& m, int64_t seq_len, const TokenIndexedSpec& ti);
inline FlopsReport flops_report(const ModelConfig& m, int64_t seq_len) {
  return flops_report(m, seq_len, token_indexed_of(m));
}

nlohmann::json to_json(const FlopsReport& r);

}  // namespace jtok
