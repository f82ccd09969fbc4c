#include "scaling/flops.h"

#include "core/error.h"

namespace jtok {

TokenIndexedSpec token_indexed_of(const ModelConfig& m) {
  // One place maps the config to its token-indexed parameters, so `flops`, `train` and
  // `scaling plan` agree.
  TokenIndexedSpec ti;
  ti.jtok_layers = m.jtok_num_layers();
  ti.jtokm_layers = m.jtokm_num_layers();
  if (ti.jtokm_layers > 0) {
    ti.n_e = m.jtokm_n_e;
    ti.top_k = m.jtokm_top_k;
  }
  return ti;
}

FlopsReport flops_report(const ModelConfig& m, int64_t seq_len, const TokenIndexedSpec& ti) {
  if (seq_len <= 0) fail("flops: seq_len must be positive, got ", seq_len);
  const int64_t d = m.hidden_size, L = m.num_hidden_layers, Vp = m.padded_vocab();
  const int64_t q = m.q_dim(), kv = m.kv_dim(), ffn = m.intermediate_size;
  FlopsReport r;
  r.seq_len = seq_len;
  // Per layer: q_proj (q,d), k_proj and v_proj (kv,d), o_proj (d,q); gate/up (ffn,d), down (d,ffn).
  r.n_c_attention = L * (d * q + 2 * d * kv + q * d);
  // Dense MLP layers; on MoE layers the activated experts: shared (width S) + k routed (width F each).
  const int64_t Lm = m.moe_num_layers();
  r.n_c_mlp = (L - Lm) * (3 * d * ffn) + Lm * 3 * d * (m.shared_intermediate() + m.num_experts_per_tok * m.moe_intermediate_size);
  if (Lm > 0) r.n_experts_inactive = Lm * 3 * d * (m.n_routed_experts - m.num_experts_per_tok) * m.moe_intermediate_size;
  r.n_c = r.n_c_attention + r.n_c_mlp;
  r.n_embedding = Vp * d;
  r.n_lm_head = m.tie_word_embeddings ? 0 : Vp * d;
  r.n_norms = L * 2 * d + d;  // input + post-attention norm per layer, final norm

  const int64_t Lj = ti.jtok_layers, Lx = ti.jtokm_layers, n_e = ti.n_e, k = ti.top_k;
  if (Lx > 0 && (n_e <= 0 || k <= 0 || k > n_e)) fail("flops: JTok-M needs 0 < K <= n_e, got K=", k, " n_e=", n_e);
  r.n_other = Lj * d + Lx * (d + d * n_e);  // scalers s; JTok-M routers R (n_e, d)
  r.n_n = (Lj + Lx * n_e) * Vp * d;         // one (Vp, d) table per JTok layer, n_e per JTok-M layer
  r.eta = r.n_c > 0 ? double(r.n_n) / double(r.n_c) : 0.0;
  r.rho = Lx > 0 ? double(k) / double(n_e) : Lj > 0 ? 1.0 : 0.0;
  r.n_other += Lm * d * m.n_routed_experts;  // MoE routers
  r.n_total = r.n_c + r.n_n + r.n_embedding + r.n_lm_head + r.n_norms + r.n_other + r.n_experts_inactive;

  // Training FLOPs per token = 3 x forward (forward 2 per multiply-add, backward twice that).
  const double T = double(seq_len);
  r.flops_6nc = 6.0 * double(r.n_c);
  r.flops_lm_head = 6.0 * double(d) * double(Vp);  // logits over the padded vocabulary (tied or not)
  // A token at position t attends to t+1 keys; averaged over t = 0..T-1 that is (T+1)/2 keys,
  // each costing 2*hd (QK^T) + 2*hd (AV) forward per head: 2 * q_dim * (T+1) per layer forward.
  r.flops_attention = 3.0 * double(L) * 2.0 * double(q) * (T + 1.0);
  r.flops_router = 6.0 * double(Lx) * double(d) * double(n_e) + 6.0 * double(Lm) * double(d) * double(m.n_routed_experts);
  // Element-wise token-indexed work per layer: L2 norm (2d), normalise (d), scale by s (d),
  // 1 + (d), gate or add (d) forward: ~6d, times 3 for training. JTok-M mixes K rows (2dK more).
  r.flops_token_indexed = 3.0 * double(d) * (6.0 * double(Lj) + (6.0 + 2.0 * double(k)) * double(Lx));
  r.flops_per_token = r.flops_6nc + r.flops_lm_head + r.flops_attention + r.flops_router + r.flops_token_indexed;
  r.forward_flops_per_token = r.flops_per_token / 3.0;
  r.flops_attention_full_square = 3.0 * double(L) * 4.0 * double(q) * T;
  r.flops_per_token_full_square = r.flops_per_token - r.flops_attention + r.flops_attention_full_square;
  return r;
}

nlohmann::json to_json(const FlopsReport& r) {
  return {
      {"n_c", r.n_c}, {"n_c_attention", r.n_c_attention}, {"n_c_mlp", r.n_c_mlp}, {"n_n", r.n_n},
      {"n_embedding", r.n_embedding}, {"n_lm_head", r.n_lm_head}, {"n_norms", r.n_norms},
      {"n_other", r.n_other}, {"n_experts_inactive", r.n_experts_inactive}, {"n_total", r.n_total}, {"eta", r.eta}, {"rho", r.rho},
      {"seq_len", r.seq_len}, {"flops_per_token_6nc", r.flops_6nc},
      {"flops_per_token_lm_head", r.flops_lm_head}, {"flops_per_token_attention", r.flops_attention},
      {"flops_per_token_router", r.flops_router}, {"flops_per_token_token_indexed", r.flops_token_indexed}, {"flops_per_token", r.flops_per_token},
      {"forward_flops_per_token", r.forward_flops_per_token},
      {"flops_per_token_attention_full_square", r.flops_attention_full_square},
      {"flops_per_token_full_square", r.flops_per_token_full_square},
  };
}

}  // namespace jtok
