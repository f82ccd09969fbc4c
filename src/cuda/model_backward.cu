// The device model's backward (src/cuda/model.h), model/transformer.cpp's backward step for step:
// the fused LM head + cross-entropy and the final norm, per layer (last to first) the MLP half and
// the attention half (JTok-M's dL/de and JTok's gate first, JTok-M's router beside q/k/v), then the
// embedding's row gradients over the forward's deduplicated ids. Every gradient accumulates (+=)
// into dm.grads (and the tables' into dm.table_grads), as on the CPU, but that the weight products of
// a step's first backward write theirs over (dm.grads_fresh: `add`, false then). On an MoE layer the
// MoE block's backward (cuda/model_moe.h) takes the MLP's place.
#include "cuda/attention.h"
#include "cuda/cross_entropy.h"
#include "cuda/embedding.h"
#include "cuda/jtok.h"
#include "cuda/jtokm.h"
#include "cuda/model.h"
#include "cuda/model_kernels.h"
#include "cuda/rmsnorm.h"
#include "cuda/rope.h"
#include "cuda/swiglu.h"

namespace jtok::cuda {

namespace {

// The losses (N), and a.dh = dL/dh_out through the LM head (dlnf in a.dx; dW_head (+)= chunk by chunk;
// tied to the embedding, always +=: that span is zeroed) and the final norm; dlogits = grad_scale / N *
// (softmax - onehot) as the CPU's head_backward.
template <typename E>
void head_backward(DeviceModel<E>& dm, DeviceActs<E>& a, float grad_scale, bool add) {
  const auto& c = dm.cfg;
  const int64_t N = a.B * a.T, d = c.hidden_size;
  cudaStream_t s = dm.stream;
  const LmHeadGemms<E> gemms{gemm_lt<E, E>, gemm_lt<E, float>};
  lm_head_cross_entropy<E>(a.losses.get(), a.dx.get(), dm.g.lm_head, a.lnf.get(), dm.w.lm_head, a.targets.get(), N, d,
                           c.vocab_size, c.padded_vocab(), grad_scale / static_cast<float>(N), a.logits_chunk.get(),
                           a.chunk_rows, gemms, s, add || c.tie_word_embeddings);
  a.dh.zero(s);
  rmsnorm_backward(a.dh.get(), dm.g.norm, a.norm_scratch.get(), a.dx.get(), a.h_out.get(), dm.w.norm, a.rstdf.get(), N,
                   d, s);
}

// Layer li's MLP half (or MoE block): a.dh = dL/dh_next in, dL/dh_mid out; a JTok layer's scaler and
// table rows get their gradients first (model/transformer.cpp's mlp_half_backward). moe_aux_grad,
// jtokm_aux_grad: dL/d(an MoE layer's aux), dL/d(a JTok-M layer's aux). add: the dense MLP's weight
// products add to their gradients (else write them over).
template <typename E>
void mlp_half_backward(DeviceModel<E>& dm, DeviceActs<E>& a, size_t li, float moe_aux_grad, float jtokm_aux_grad,
                       bool add) {
  const auto& c = dm.cfg;
  const auto& W = dm.w.layers[li];
  const auto& G = dm.g.layers[li];
  const auto& L = a.layers[li];
  const int64_t N = a.B * a.T, d = c.hidden_size, F = c.intermediate_size;
  cudaStream_t s = dm.stream;
  if (W.jtokm_router)  // JTok-M's dL/de and dL/dg from dL/dh_next; its router's products later
    jtokm_backward_de(a.m_de.get(), G.jtokm_scale, a.m_dg.get(), a.m_scratch.get(), L.jtokm(), a.dh.get(),
                      W.jtokm_scale, a.ids.get(), dm.table(dm.jtokm_table[li]), jtokm_aux_grad, jtokm_dims(c, N), s);
  const E* dmlp = a.dh.get();  // the update's gradient: dh, or on a JTok layer dh * p
  if (W.jtok_scale) {
    const int64_t k = dm.jtok_table[li];
    jtok_backward(a.dmlp.get(), G.jtok_scale, dm.table_grad(k), dm.touched(k), a.jtok_scratch.get(),
                  a.dh.get(), L.mlp_out.get(), W.jtok_scale, dm.table(k), L.nrows.get(), L.inv_norm.get(),
                  a.table_batch(), N, d, c.jtok_norm, s);
    dmlp = a.dmlp.get();
  }
  if (W.moe.router) {
    a.dx.zero(s);
    moe_block_backward(dm.mm, a.dx.get(), G.moe, a.moe, dmlp, L.m.get(), L.moe, W.moe, moe_dims(c), N, moe_aux_grad, s);
  } else {
    // dact, dx: written over by their one product (false: no zeroing first, old values never read)
    linear_backward<E, float>(dm.mm, a.dact.get(), G.wd, dmlp, L.act.get(), W.wd, N, F, d, s, false, add);
    E* dgu = a.dgate.get();  // dgate | dup rows (N, 2F); [Wg; Wu] one weight, its gradient likewise
    const E* gu = L.gate.get();
    swiglu_backward(dgu, dgu + F, a.dact.get(), gu, gu + F, N, F, 2 * F, s);
    linear_backward<E, float>(dm.mm, a.dx.get(), G.wg, dgu, L.m.get(), W.wg, N, d, 2 * F, s, false, add);
  }
  rmsnorm_backward(a.dh.get(), G.ln2, a.norm_scratch.get(), a.dx.get(), L.h_mid.get(), W.ln2, L.rstd2.get(), N, d, s);
}

// dq | dk | dv (dg) of the product's rows from those of the attention's inputs: RoPE's inverse on
// dq's and dk's H + KV heads (one launch), unless the attention's backward wrote them so (rotated: its
// bf16 kernels); qk_norm's backward in place (qkv_variants.cpp's head_norm_backward: dq, dk become the
// gradients of the norms' inputs); [bq; bk; bv]'s gradients (back to back as the weights') in one pass.
template <typename E>
void qkv_grads_backward(DeviceModel<E>& dm, DeviceActs<E>& a, size_t li, const QkvView<E>& dg, bool rotated) {
  const auto& c = dm.cfg;
  const auto& W = dm.w.layers[li];
  const auto& G = dm.g.layers[li];
  const auto& L = a.layers[li];
  const int64_t B = a.B, T = a.T, N = B * T, qd = c.q_dim();
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.hd();
  cudaStream_t s = dm.stream;
  if (!rotated) rope_backward(dg.q, dm.rope_cos.get(), dm.rope_sin.get(), B, T, H + KV, hd, dg.stride, s);
  if (c.qk_norm) {
    const E* x = L.q_in.get();  // the norms' inputs, in the product's rows
    float* scratch = a.norm_scratch.get();
    rmsnorm_backward_in_place(dg.q, G.q_norm, scratch, x, W.q_norm, L.rstd_q.get(), N * H, hd, s, {H, dg.stride});
    rmsnorm_backward_in_place(dg.k, G.k_norm, scratch, x + qd, W.k_norm, L.rstd_k.get(), N * KV, hd, s,
                              {KV, dg.stride});
  }
  if (W.bq) bias_grad(G.bq, dg.q, N, dg.stride, a.norm_scratch.get(), s);  // the norms' partials used up
}

// JTok-M's router of layer li (after its dL/de and dL/dg, in a.m_de and a.m_dg): dR += dg^T a and
// a.dx = dg R (written over: the attention input's gradient starts here, as the CPU's); the tables'
// rows (fp32 gradients from the fp32 dL/de).
template <typename E>
void jtokm_router_backward(DeviceModel<E>& dm, DeviceActs<E>& a, size_t li) {
  const JTokMDims dims = jtokm_dims(dm.cfg, a.B * a.T);
  const auto& L = a.layers[li];
  const int64_t k = dm.jtokm_table[li];
  linear_backward<E, float>(dm.mm, a.dx.get(), dm.g.layers[li].jtokm_router, a.m_dg.get(), L.a.get(),
                            dm.w.layers[li].jtokm_router, dims.N, dims.d, dims.n_e, dm.stream, false);
  jtokm_backward_tables(dm.table_grad(k), dm.touched(k), L.jtokm(), a.m_de.get(), a.table_batch(), dims, a.m_hot.get(),
                        dm.stream);
}

// The attention backward at dm.attn_rows.bwd rows a warp (chosen at the first forward), dq and dk through
// RoPE's inverse where the kernels do it (bf16): whether they did.
template <typename E>
bool attention_backward_rows(DeviceModel<E>& dm, DeviceActs<E>& a, const DeviceLayerActs<E>& L, const QkvView<E>& v,
                             const QkvView<E>& dg) {
  const auto& c = dm.cfg;
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.hd();
  const RopeTables rope{dm.rope_cos.get(), dm.rope_sin.get()};
  if constexpr (std::is_same_v<E, __nv_bfloat16>) {
    if (dm.attn_rows.bwd == 32)
      return attention_backward_wide(dg.q, dg.k, dg.v, a.row_terms.get(), a.datt.get(), L.att.get(), L.lse.get(), v.q,
                                     v.k, v.v, a.B, a.T, H, KV, hd, dm.stream, v.attn, false, rope);
  }
  return attention_backward(dg.q, dg.k, dg.v, a.row_terms.get(), a.datt.get(), L.att.get(), L.lse.get(), v.q, v.k, v.v,
                            a.B, a.T, H, KV, hd, dm.stream, v.attn, false, rope);
}

// Layer li's attention half: a.dh = dL/dh_mid in, dL/dh_in out; JTok-M's router (on the attention
// input) adds its part of that input's gradient first. add: o's and q | k | v's weight products add to
// their gradients (else write them over).
template <typename E>
void attention_half_backward(DeviceModel<E>& dm, DeviceActs<E>& a, size_t li, bool add) {
  const auto& c = dm.cfg;
  const auto& W = dm.w.layers[li];
  const auto& G = dm.g.layers[li];
  const auto& L = a.layers[li];
  const int64_t B = a.B, T = a.T, N = B * T, d = c.hidden_size, qd = c.q_dim();
  cudaStream_t s = dm.stream;
  // datt, dq | dk | dv (every element of each row: the attention's one writer a row) and dx are
  // written over by their first product, never zeroed first (false: old values not read)
  linear_backward<E, float>(dm.mm, a.datt.get(), G.wo, a.dh.get(), L.att.get(), W.wo, N, qd, d, s, false, add);
  const QkvView<E> v = layer_qkv(c, L);
  const QkvView<E> dg = qkv_view(c, a.dq.get(), a.dq.get());
  const bool rotated = attention_backward_rows(dm, a, L, v, dg);
  qkv_grads_backward(dm, a, li, dg, rotated);
  if (W.jtokm_router) jtokm_router_backward(dm, a, li);
  // [Wq; Wk; Wv] one (qd + 2 kvd, d) weight, its gradient likewise
  linear_backward<E, float>(dm.mm, a.dx.get(), G.wq, dg.q, L.a.get(), W.wq, N, d, dg.stride, s,
                            W.jtokm_router != nullptr, add);
  rmsnorm_backward(a.dh.get(), G.ln1, a.norm_scratch.get(), a.dx.get(), L.h_in.get(), W.ln1, L.rstd1.get(), N, d, s);
}

}  // namespace

template <typename E>
double backward(DeviceModel<E>& dm, DeviceActs<E>& a, const int32_t* targets, float grad_scale) {
  const int64_t N = a.B * a.T;
  JTOK_CHECK(N > 0 && !a.layers.empty(), "cuda model: backward before forward");
  check_ids(targets, N, dm.cfg.vocab_size, "target");
  JTOK_CUDA_CHECK(cudaMemcpyAsync(a.targets.get(), targets, a.targets.bytes(), cudaMemcpyHostToDevice, dm.stream));
  // The step loss holds the mean of the JTok-M layers' aux losses: each layer's weight 1/#layers.
  int64_t jtokm_layers = 0;
  for (const auto& W : dm.w.layers) jtokm_layers += W.jtokm_router ? 1 : 0;
  const float jtokm_aux_grad = jtokm_layers > 0 ? grad_scale / static_cast<float>(jtokm_layers) : 0.0f;
  // And the mean of the MoE layers' (model/transformer.cpp's mlp_half_backward).
  const int64_t moe_layers = dm.cfg.moe_num_layers();
  const float moe_aux_grad = moe_layers > 0 ? grad_scale / static_cast<float>(moe_layers) : 0.0f;
  if (dm.n_tables > 0) dm.table_flags.flagged = true;  // the layers' row gradients flag their rows
  const bool add = !dm.grads_fresh;               // else the products write their spans (dm.product_grads) over
  dm.grads_fresh = false;
  head_backward(dm, a, grad_scale, add);
  mark_phase(dm.profile, "lm head + loss", dm.stream);  // forward and backward, chunk by chunk
  for (size_t li = a.layers.size(); li-- > 0;) {
    mlp_half_backward(dm, a, li, moe_aux_grad, jtokm_aux_grad, add);
    mark_phase(dm.profile, dm.has_tables(li) ? "mlp + tables backward" : "mlp backward", dm.stream);
    attention_half_backward(dm, a, li, add);
    mark_phase(dm.profile, "attention backward", dm.stream);
  }
  // dL/dh_in of layer 0 into the embedding's rows, per id in position order (the forward's dedup).
  embedding_backward(dm.g.embed, a.dh.get(), a.row_batch(), N, dm.cfg.hidden_size, a.embed_hot.get(), dm.stream,
                     dm.embed_flags.flags.get());
  dm.embed_flags.flagged |= dm.embed_rows_on();
  const double loss = device_mean(a.losses.get(), a.loss_sum.get(), a.readback, N, dm.stream);
  mark_phase(dm.profile, "embedding backward", dm.stream);  // with the loss read back
  return loss;
}

template double backward<float>(DeviceModel<float>&, DeviceActs<float>&, const int32_t*, float);
template double backward<__nv_bfloat16>(DeviceModel<__nv_bfloat16>&, DeviceActs<__nv_bfloat16>&, const int32_t*,
                                        float);

}  // namespace jtok::cuda
