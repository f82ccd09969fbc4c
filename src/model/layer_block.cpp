#include "model/layer_block.h"

#include <algorithm>
#include <cstring>

#include "core/profile.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

namespace jtok {

namespace {

// RoPE on q (N, H*hd) and k (N, KV*hd) at the rows' positions.
void rope_rows(const Model& m, float* q, float* k, int64_t N, const LayerKernels& kn) {
  const auto& c = m.cfg;
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.hd();
  if (!kn.pos) {
    rope_forward(q, m.rope, kn.B, kn.T, H, hd);
    rope_forward(k, m.rope, kn.B, kn.T, KV, hd);
    return;
  }
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
#pragma omp parallel for schedule(static) if (N > 1)
  for (int64_t i = 0; i < N; ++i) {
    rope_forward(q + i * qd, m.rope, 1, 1, H, hd, kn.pos[i]);
    rope_forward(k + i * kvd, m.rope, 1, 1, KV, hd, kn.pos[i]);
  }
}

// h_in -> h_mid: the input norm, JTok-M's routing (it reads the attention input), q/k/v, RoPE,
// attention, the output projection onto the residual.
void attention_half(const Model& m, int64_t l, const LayerBuffers& b, const RowBatch& ids, int64_t N,
                    const LayerKernels& kn, const AttendFn& attend) {
  const auto& c = m.cfg;
  const auto& W = m.w.layers[l];
  const int64_t d = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  { JTOK_PROFILE("rmsnorm_fwd"); rmsnorm_forward(b.a, b.rstd1, b.h_in, W.ln1, N, d, eps); }
  if (W.jtokm_router) {  // route now, mix at the write-back
    JTOK_PROFILE("jtokm_route");
    b.jtokm->router_rows = kn.rows;
    jtokm_route(*b.jtokm, b.a, W.jtokm_router, ids, N, d, jtokm_hyper(c), m.jtokm_table[l], kn.tables);
  }
  {
    JTOK_PROFILE("qkv_fwd");
    const LinearOut qkv[3] = {{b.q, layer_matrix(m, l, Proj::q)},
                              {b.k, layer_matrix(m, l, Proj::k)},
                              {b.v, layer_matrix(m, l, Proj::v)}};
    linear_forward_lowp_multi(qkv, 3, b.a, N, kn.rows);  // the same values as one call each
    qkv_variants_forward(W, b.q, b.k, b.v, N, c.num_attention_heads, c.num_key_value_heads, c.hd(), eps, *b.qk);
  }
  { JTOK_PROFILE("rope_fwd"); rope_rows(m, b.q, b.k, N, kn); }
  if (kn.tables) kn.tables->poll();
  { JTOK_PROFILE("attn_fwd"); attend(b.att, b.q, b.k, b.v); }
  {  // h_mid = h_in + att @ Wo^T (the product accumulates onto the copied residual)
    JTOK_PROFILE("o_proj_fwd");
    if (b.h_mid != b.h_in) std::memcpy(b.h_mid, b.h_in, sizeof(float) * N * d);
    linear_forward_lowp(b.h_mid, b.att, layer_matrix(m, l, Proj::o), N, /*accumulate=*/true, kn.rows);
  }
  if (kn.tables) kn.tables->poll();
}

// out (N,d) += the MLP (or MoE) update of m.
void mlp_update(const Model& m, int64_t l, const LayerBuffers& b, int64_t N, const LayerKernels& kn, float* out) {
  const auto& W = m.w.layers[l];
  if (W.moe.router) {
    JTOK_PROFILE("moe_fwd");
    moe_forward(out, *b.moe, b.m, W.moe, moe_dims(m.cfg), N, moe_lowp(m, l), kn.rows);
    return;
  }
  {
    JTOK_PROFILE("gate_up_fwd");
    const LinearOut gu[2] = {{b.gate, layer_matrix(m, l, Proj::gate)}, {b.up, layer_matrix(m, l, Proj::up)}};
    linear_forward_lowp_multi(gu, 2, b.m, N, kn.rows);
  }
  { JTOK_PROFILE("swiglu_fwd"); swiglu_forward(b.act, b.gate, b.up, N * m.cfg.intermediate_size); }
  { JTOK_PROFILE("down_fwd"); linear_forward_lowp(out, b.act, layer_matrix(m, l, Proj::down), N, true, kn.rows); }
}

// h_mid -> h_out: the post-attention norm, the MLP update (JTok-gated where on), JTok-M's injection.
void mlp_half(const Model& m, int64_t l, const LayerBuffers& b, const RowBatch& ids, int64_t N,
              const LayerKernels& kn) {
  const auto& c = m.cfg;
  const auto& W = m.w.layers[l];
  const int64_t d = c.hidden_size;
  const size_t Nd = static_cast<size_t>(N * d);
  const float eps = static_cast<float>(c.rms_norm_eps);
  { JTOK_PROFILE("rmsnorm_fwd"); rmsnorm_forward(b.m, b.rstd2, b.h_mid, W.ln2, N, d, eps); }
  // The update goes to h_out on top of h_mid, or, with JTok, to mlp_out before the gate. A JTok layer
  // whose s is all 0 has p = 1: it takes the ungated path, the plain model's bits (docs/jtok.md
  // "Attaching tables"), and a training forward computes mlp_out apart for the backward.
  const bool gated = W.jtok_scale && !jtok_gate_is_one(W.jtok_scale, d);
  if (gated) {
    b.jtok->mlp_out.assign(Nd, 0.0f);
    mlp_update(m, l, b, N, kn, b.jtok->mlp_out.data());
  } else {
    if (b.h_out != b.h_mid) std::memcpy(b.h_out, b.h_mid, sizeof(float) * Nd);
    mlp_update(m, l, b, N, kn, b.h_out);
  }
  if (W.jtok_scale) {  // h_out = h_mid + Delta_m * (1 + s * Norm(E[x]))
    JTOK_PROFILE("jtok_fwd");
    jtok_prepare(*b.jtok, m.tables[m.jtok_table[l]], ids, static_cast<float>(c.jtok_eps), c.jtok_norm, kn.row_sync,
                 m.jtok_table[l], kn.tables);
    if (gated) {
      jtok_forward(b.h_out, b.h_mid, *b.jtok, W.jtok_scale, ids, N, d);
    } else if (kn.keep_for_backward) {
      b.jtok->mlp_out.assign(Nd, 0.0f);
      mlp_update(m, l, b, N, kn, b.jtok->mlp_out.data());  // the same values again (MoE: its activations too)
    }
  }
  if (W.jtokm_router) {  // h_out += c * s * Norm(sum_G w_i E_i[x]), routed on the attention input
    JTOK_PROFILE("jtokm_fwd");
    float* out = b.jtokm_delta ? b.jtokm_delta : b.h_out;
    if (b.jtokm_delta) std::fill(out, out + Nd, 0.0f);
    jtokm_mix_inject(out, *b.jtokm, W.jtokm_scale, &m.tables[m.jtokm_table[l]], ids, N, d, jtokm_hyper(c), kn.row_sync,
                     m.jtokm_table[l], kn.tables);
    if (b.jtokm_delta)
      for (size_t j = 0; j < Nd; ++j) b.h_out[j] += out[j];
  }
}

}  // namespace

void layer_forward(const Model& m, int64_t l, const LayerBuffers& b, const RowBatch& ids, int64_t N,
                   const LayerKernels& kn, const AttendFn& attend) {
  attention_half(m, l, b, ids, N, kn, attend);
  mlp_half(m, l, b, ids, N, kn);
}

}  // namespace jtok
