#include "model/activation_bytes.h"

#include <vector>

#include "model/moe.h"

namespace jtok {

namespace {

template <typename T>
int64_t bytes(const std::vector<T>& v) {
  return static_cast<int64_t>(v.size() * sizeof(T));
}
template <typename T, typename... More>
int64_t bytes(const std::vector<T>& v, const More&... more) {
  return bytes(v) + bytes(more...);
}

}  // namespace

ActivationBytes activation_bytes(const ModelConfig& c, int64_t B, int64_t T) {
  const int64_t N = B * T, d = c.hidden_size, F = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t H = c.num_attention_heads, L = c.num_hidden_layers, f = 4, i32 = 4, f64 = 8;
  ActivationBytes r;
  // Per layer: h_in, a, h_mid, m (N,d) and rstd1, rstd2 (N); then h_out, lnf, dh, dx (N,d), rstdf (N).
  r.residual = L * f * (4 * N * d + 2 * N) + f * (4 * N * d + N);
  // Per layer: q, att (N,qd), k, v (N,kvd), lse (B,H,T); scratch dq, datt (N,qd), dk, dv (N,kvd).
  r.attention = L * f * (2 * N * qd + 2 * N * kvd + B * H * T) + f * (2 * N * qd + 2 * N * kvd);
  // qk_norm, per layer: q, k before their norms (N,qd) (N,kvd), rstd_q (N*H), rstd_k (N*KV), and the
  // backward's copy of dq (N,qd) (then dk's, in the same buffer).
  if (c.qk_norm) r.attention += L * f * (2 * N * qd + N * kvd + N * H + N * c.num_key_value_heads);
  r.attention_probs_txt = L * f * B * H * T * T;
  int64_t dense_layers = 0, moe_layers = 0;
  for (int64_t l = 0; l < L; ++l) (c.moe_on_layer(l) ? moe_layers : dense_layers) += 1;
  r.mlp = dense_layers * f * 3 * N * F + f * 3 * N * F;  // gate, up, act per dense layer; dgate, dup, dact scratch
  if (moe_layers > 0) {
    const MoeDims m = moe_dims(c);
    const int64_t NK = N * m.K;
    // probs (N,E), topi (NK), topw (NK), offsets (E+1), slot_of, row_of (NK), frac (E), xg, eo (NK,d),
    // g, u, act (NK,F), shared sg, su, sact (N,S).
    const int64_t per_layer = f * N * m.E + i32 * NK + f * NK + i32 * (m.E + 1) + 2 * i32 * NK + f * m.E +
                              f * 2 * NK * d + f * 3 * NK * m.F + f * 3 * N * m.S;
    // Scratch: deo, dxg (NK,d), dact, dg, du (NK,F), dprobs (N,E), dsact, dsg, dsu (N,S).
    const int64_t scratch = f * (2 * NK * d + 3 * NK * m.F + N * m.E + 3 * N * m.S);
    r.mlp += moe_layers * per_layer + scratch;
  }
  if (c.jtok || c.jtokm) {
    const int64_t U = N;  // worst case: every id distinct
    r.tables = i32 * (U + N + (U + 1) + N);  // the batch's RowBatch: unique, inverse, offsets, order
    int64_t jtok_layers = 0, jtokm_layers = 0;
    for (int64_t l = 0; l < L; ++l) {
      jtok_layers += c.jtok_on_layer(l);
      jtokm_layers += c.jtokm_on_layer(l);
    }
    // JTok: rows, nrows (U,d), inv_norm (U), mlp_out (N,d); scratch dmlp (N,d).
    if (c.jtok) r.tables += jtok_layers * f * (2 * U * d + U + N * d) + f * N * d;
    if (c.jtokm) {
      const int64_t ne = c.jtokm_n_e, K = c.jtokm_top_k, S = N * K;  // S: distinct (id, table) pairs chosen
      // logits, sig (N,ne), sel (N,K) int, w (N,K), slot (U,ne) int, slot_u, slot_table (S) int, rows (S,d),
      // e, de (N,d), inv_norm (N), load, prob_sum, weight_sum (ne) double; scratch da_jtokm (N,d).
      r.tables += jtokm_layers * (f * 2 * N * ne + i32 * N * K + f * N * K + i32 * U * ne + 2 * i32 * S + f * S * d +
                                  f * 2 * N * d + f * N + 3 * f64 * ne) +
                  f * N * d;
    }
  }
  r.logits = f * N * c.padded_vocab();
  return r;
}

ActivationBytes measured_activation_bytes(const Activations& a, const ModelConfig& c) {
  ActivationBytes r;
  for (const LayerActs& l : a.layers) {
    r.residual += bytes(l.h_in, l.rstd1, l.a, l.h_mid, l.rstd2, l.m);
    r.attention +=
        bytes(l.q, l.k, l.v, l.lse, l.att) + bytes(l.qk.q_in, l.qk.k_in, l.qk.rstd_q, l.qk.rstd_k, l.qk.scratch);
    r.mlp += bytes(l.gate, l.up, l.act);
    const MoeActs& m = l.moe;
    r.mlp += bytes(m.probs, m.topi, m.topw, m.offsets, m.slot_of, m.row_of, m.frac, m.xg, m.g, m.u, m.act, m.eo, m.sg,
                   m.su, m.sact);
    r.tables += bytes(l.jtok.rows, l.jtok.inv_norm, l.jtok.nrows, l.jtok.mlp_out);
    const JTokMActs& j = l.jtokm;
    r.tables += bytes(j.logits, j.sig, j.sel, j.w, j.slot, j.slot_u, j.slot_table, j.rows, j.e, j.inv_norm, j.de) +
                bytes(j.load, j.prob_sum, j.weight_sum);
  }
  r.residual += bytes(a.h_out, a.rstdf, a.lnf, a.dh, a.dx);
  r.attention += bytes(a.dq, a.dk, a.dv, a.datt);
  r.mlp += bytes(a.dgate, a.dup, a.dact);
  const MoeScratch& s = a.moe_scratch;
  r.mlp += bytes(s.deo, s.dact, s.dg, s.du, s.dxg, s.dprobs, s.dsact, s.dsg, s.dsu);
  r.tables += bytes(a.ids.unique, a.ids.inverse, a.ids.offsets, a.ids.order) + bytes(a.dmlp, a.da_jtokm);
  r.logits = bytes(a.logits);
  r.attention_probs_txt = static_cast<int64_t>(a.layers.size()) * 4 * a.B * c.num_attention_heads * a.T * a.T;
  return r;
}

}  // namespace jtok
