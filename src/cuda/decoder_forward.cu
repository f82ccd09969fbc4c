// The GPU decoder's forward over a step's rows (src/cuda/decoder_state.h), the CPU decode's order
// (infer/generate.cpp's forward_rows over model/layer_block.cpp): the embedding, per layer
//   a = RMSNorm(h); JTok-M routes on a; q, k, v = a W^T (+ b) (qk_norm: per-head RMSNorm); RoPE at
//   each row's position; k, v into the pages; attention (a fresh prefill: over the rows' own keys
//   and values, the CPU prefill's full forward; else over the pages, the CPU decode's cache);
//   h += att Wo^T; m = RMSNorm(h); h += Delta_m (JTok, gated: h += Delta_m * (1 + s Norm(E[x])));
//   JTok-M: h += c s Norm(sum_k w_k E_{sel_k}[x])
// then the final norm and the LM head of the rows whose logits are asked, in fp32.
// The token-table rows: StepRows' slots (max_rows, d) a table, the rows of the step's sorted unique
// ids. JTok reads them through an identity `unique` (row u of the slot is unique id u's) and the
// step's `inverse`; JTok-M reads a layer's n_e consecutive slots as its E (n_e, V = max_rows, d) at
// `ids` = inverse (cuda/jtokm.h indexes (sel * V + id) * d).
// Stream work only past the rows' request (a decode step's graph captures forward_rows and
// head_forward: cuda/decoder_step.cu); a profiled step's phases are marked on st.prof.
#include <algorithm>
#include <chrono>

#include "cuda/attention.h"
#include "cuda/decoder_state.h"
#include "cuda/embedding.h"
#include "cuda/jtok.h"
#include "cuda/rmsnorm.h"
#include "cuda/row_invariant_linear.h"
#include "cuda/row_invariant_mma.h"
#include "cuda/swiglu.h"

namespace jtok::cuda {

namespace {

// A profiled step's mark on the decoder's stream (nothing otherwise).
template <typename E>
void mark(DecoderState<E>& st, const StepShape& sh, StepMark m, int64_t layer = 0) {
  if (sh.timed) st.prof->mark(m, layer, st.s());
}

template <typename E>
PagedRows paged_rows(const DecoderState<E>& st, int64_t R) {
  return {st.acts.row_seq(), st.acts.pos(), st.kv.tables.get(), st.kv.max_pages, R};
}

// Whether a step of R rows norms a product's input inside the product (RowNorm: one kernel, the
// bits of the norm then the product): a decode step, whose products are row_invariant_linear's.
template <typename E>
bool norm_in_product(const DecoderState<E>& st, int64_t R) {
  return R <= st.mm.row_invariant_rows();
}

template <typename E>
RowNorm<E> row_norm(const DecoderState<E>& st, const E* gain) {
  return {gain, static_cast<float>(st.cfg.rms_norm_eps)};
}

// Layer l's int8 matrices when a step of R rows reads them (an int8 export's decode step,
// settings.int8_decode: row_invariant_linear_q8's products), else null.
template <typename E>
const DecoderQ8::Layer* q8_layer(const DecoderState<E>& st, size_t l, int64_t R) {
  return st.q8.on() && norm_in_product(st, R) ? &st.q8.layers[l] : nullptr;
}

// Whether layer l's JTok-M router runs in the q | k | v product's launch (row_invariant_linear_and_side):
// a decode step's normed products on the CUDA cores, not the int8 ones, and a router whose rows
// start 16-byte aligned (else the launch would read q | k | v's weights element by element too).
template <typename E>
bool router_beside_qkv(const DecoderState<E>& st, size_t l, int64_t R, bool normed) {
  const E* router = st.w.layers[l].jtokm_router;
  return normed && router && reinterpret_cast<uintptr_t>(router) % 16 == 0 && !q8_layer(st, l, R) &&
         !st.mm.row_invariant_tensor_cores();
}

// The layer's q | k | v rows (R, qd + 2 kvd) = a [Wq; Wk; Wv]^T (+ [bq; bk; bv]) in one product: the
// three weights (and biases) lie back to back in the flat parameters (require_fused_layout), and each
// output element's bits are its own column's (row_invariant_linear for a decode step). normed: a = the
// input norm of h, made inside the product; else a is A.a. router: JTok-M's router logits in the same
// launch (router_beside_qkv).
template <typename E>
void qkv_rows(DecoderState<E>& st, size_t l, int64_t R, bool normed, bool router) {
  const ModelConfig& c = st.cfg;
  const DeviceLayerView<E>& W = st.w.layers[l];
  DecoderActs<E>& A = st.acts;
  const int64_t d = c.hidden_size, OC = c.q_dim() + 2 * c.kv_dim();
  if (const DecoderQ8::Layer* q8 = q8_layer(st, l, R))
    row_invariant_linear_q8<E, E>(A.qkv.get(), A.h.get(), q8->qkv, W.bq, R, d, OC, false, st.s(), row_norm(st, W.ln1));
  else if (router)
    row_invariant_linear_and_side<E, E>(A.qkv.get(), A.h.get(), W.wq, W.bq, R, d, OC, false, A.m_logits.get(),
                                        W.jtokm_router, c.jtokm_n_e, st.s(), row_norm(st, W.ln1));
  else if (normed)
    row_invariant_product<E, E>(st.mm.row_invariant_tensor_cores(), A.qkv.get(), A.h.get(), W.wq, W.bq, R, d, OC, false,
                                st.s(), row_norm(st, W.ln1));
  else
    linear_forward<E, E>(st.mm, A.qkv.get(), A.a.get(), W.wq, W.bq, R, d, OC, false, st.s());
}

// q, k, v (packed) from the qkv rows: per-head norm, RoPE at each row's position, k and v of layer l
// into the pages, in the pool's type (cuda/paged_kv.h's paged_qkv: one kernel).
template <typename E>
void ready_qkv(DecoderState<E>& st, size_t l, int64_t R) {
  const ModelConfig& c = st.cfg;
  const DeviceLayerView<E>& W = st.w.layers[l];
  DecoderActs<E>& A = st.acts;
  const QkvOut<E> out{A.q.get(), A.k.get(), A.v.get()};
  const QkvRows<E> in{A.qkv.get(), c.q_dim() + 2 * c.kv_dim(), c.num_attention_heads, W.q_norm, W.k_norm,
                      static_cast<float>(c.rms_norm_eps), st.rope_cos.get(), st.rope_sin.get()};
  const PagedKv layer = st.kv.layer(static_cast<int64_t>(l));
  if (st.kv.bf16) paged_qkv<E, __nv_bfloat16>(out, in, layer, paged_rows(st, R), st.s());
  else paged_qkv<E, float>(out, in, layer, paged_rows(st, R), st.s());
}

// att (R, qd) = each row's q over its sequence's pages 0..pos.
template <typename E>
void attend_pages(DecoderState<E>& st, size_t l, const StepShape& sh) {
  const int64_t H = st.cfg.num_attention_heads, hd = st.cfg.hd();
  DecoderActs<E>& A = st.acts;
  const PagedKv layer = st.kv.layer(static_cast<int64_t>(l));
  const PagedRows rows = paged_rows(st, sh.R);
  const PagedScratch scratch{A.attn_scratch.get(), static_cast<int64_t>(A.attn_scratch.size())};
  if (st.kv.bf16)
    paged_attention<E, __nv_bfloat16>(A.att.get(), A.q.get(), H * hd, layer, rows, H, sh.max_len, scratch,
                                      A.attn_counters.get(), st.s());
  else
    paged_attention<E, float>(A.att.get(), A.q.get(), H * hd, layer, rows, H, sh.max_len, scratch,
                              A.attn_counters.get(), st.s());
}

// JTok-M's router of layer l on the attention input a (normed: made inside the router's product from
// h, as q | k | v's): logits (R, n_e) fp32, which the layer's injection routes from (jtokm_inject).
// Beside q | k | v in its launch where that product is row_invariant_linear's (router_beside_qkv).
template <typename E>
void jtokm_router_logits(DecoderState<E>& st, size_t l, const StepShape& sh, bool normed) {
  DecoderActs<E>& A = st.acts;
  const DeviceLayerView<E>& W = st.w.layers[l];
  const JTokMDims dims = jtokm_dims(st.cfg, sh.R);
  if (normed)
    row_invariant_linear<E, float>(A.m_logits.get(), A.h.get(), W.jtokm_router, nullptr, sh.R, dims.d, dims.n_e, false,
                                   st.s(), row_norm(st, W.ln1));
  else
    linear_forward<E, float>(st.mm, A.m_logits.get(), A.a.get(), W.jtokm_router, nullptr, sh.R, dims.d, dims.n_e, false,
                             st.s());
}

// h -> h: the input norm, JTok-M's router logits, q | k | v in one product, their per-head norm, RoPE at
// the rows' positions and the pages in one kernel, attention, h += att Wo^T. A decode step norms
// inside the q | k | v product (and JTok-M's router's) instead of in a kernel of its own.
template <typename E>
void attention_half(DecoderState<E>& st, size_t l, const StepShape& sh) {
  const ModelConfig& c = st.cfg;
  const DeviceLayerView<E>& W = st.w.layers[l];
  DecoderActs<E>& A = st.acts;
  const int64_t R = sh.R, d = c.hidden_size, qd = c.q_dim();
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.hd();
  cudaStream_t s = st.s();
  const bool normed = norm_in_product(st, R);
  if (!normed) rmsnorm_forward(A.a.get(), A.rstd.get(), A.h.get(), W.ln1, R, d, static_cast<float>(c.rms_norm_eps), s);
  const bool router_in_qkv = router_beside_qkv(st, l, R, normed);
  if (W.jtokm_router && !router_in_qkv)
    jtokm_router_logits(st, l, sh, normed);  // logits now (or in qkv_rows), routed and mixed at the write-back
  qkv_rows(st, l, R, normed, router_in_qkv);
  ready_qkv(st, l, R);  // the pages get every row's k, v first: a chunk's later rows read its earlier ones
  if (sh.fresh) attention_forward(A.att.get(), A.lse.get(), A.q.get(), A.k.get(), A.v.get(), 1, R, H, KV, hd, s);
  else attend_pages(st, l, sh);
  if (const DecoderQ8::Layer* q8 = q8_layer(st, l, R))
    row_invariant_linear_q8<E, E>(A.h.get(), A.att.get(), q8->o, nullptr, R, qd, d, true, s);
  else
    linear_forward<E, E>(st.mm, A.h.get(), A.att.get(), W.wo, nullptr, R, qd, d, true, s);
}

// Whether layer l's MLP update norms h itself: a dense layer's decode step (row_invariant_swiglu
// with the norm); else the norm is a kernel of its own, into A.x.
template <typename E>
bool mlp_norms_inside(const DecoderState<E>& st, size_t l, int64_t R) {
  return norm_in_product(st, R) && !st.w.layers[l].moe.router;
}

// out (R,d) = (accumulate: +=) Delta_m of m = RMSNorm(h) (cuda/model.h's mlp_update): m in A.x, or
// (mlp_norms_inside) made inside the gate | up product. A dense layer's gate | up (R, 2F) in one
// product (Wg, Wu back to back: require_fused_layout); a decode step's with the norm and SwiGLU in the
// same kernel (row_invariant_swiglu). A decode step of an int8 export reads its int8 matrices (an MoE
// layer's experts too).
template <typename E>
void mlp_update_rows(DecoderState<E>& st, size_t l, int64_t R, E* out, bool accumulate) {
  DecoderActs<E>& A = st.acts;
  const DeviceLayerView<E>& W = st.w.layers[l];
  const DecoderQ8::Layer* q8 = q8_layer(st, l, R);
  if (W.moe.router) {
    const MlpBuffers<E> b{nullptr, nullptr, &A.moe, &A.moe_scratch, q8 ? &q8->moe : nullptr};
    mlp_update(st.mm, st.cfg, W, b, A.x.get(), out, accumulate ? out : nullptr, R, st.s());
    return;
  }
  const int64_t d = st.cfg.hidden_size, F = st.cfg.intermediate_size;
  if (q8) {
    row_invariant_swiglu_q8<E>(A.act.get(), A.h.get(), q8->gate_up, R, d, F, st.s(), row_norm(st, W.ln2));
  } else if (mlp_norms_inside(st, l, R)) {  // a decode step: the norm's, the product's and SwiGLU's bits, one kernel
    row_invariant_swiglu_product<E>(st.mm.row_invariant_tensor_cores(), A.act.get(), A.h.get(), W.wg, R, d, F, st.s(),
                                    row_norm(st, W.ln2));
  } else {
    E* gu = A.gate_up.get();
    linear_forward<E, E>(st.mm, gu, A.x.get(), W.wg, nullptr, R, d, 2 * F, false, st.s());
    swiglu_forward(A.act.get(), gu, gu + F, R, F, 2 * F, st.s());
  }
  if (q8)
    row_invariant_linear_q8<E, E>(out, A.act.get(), q8->down, nullptr, R, F, d, accumulate, st.s());
  else
    linear_forward<E, E>(st.mm, out, A.act.get(), W.wd, nullptr, R, F, d, accumulate, st.s());
}

// JTok's gate of layer l (its rows in slot 0 of rows layer k): h += mlp_out * (1 + s Norm(E[x])).
template <typename E>
void jtok_gate(DecoderState<E>& st, size_t l, int64_t k, int64_t R) {
  DecoderActs<E>& A = st.acts;
  const int64_t d = st.cfg.hidden_size;
  const DeviceRowBatch& b = st.rows->batch();
  const DeviceRowBatch rows_of_unique{A.identity.get(), b.inverse, b.offsets, b.order, b.num_unique};
  jtok_prepare(A.nrows.get(), A.inv_norm.get(), st.rows->rows(k, 0), rows_of_unique, R, d,
               static_cast<float>(st.cfg.jtok_eps), st.cfg.jtok_norm, st.s());
  jtok_forward(A.h.get(), A.h.get(), A.mlp_out.get(), st.w.layers[l].jtok_scale, A.nrows.get(), rows_of_unique, R, d,
               st.s());
}

// JTok-M's injection of layer l (its n_e tables' rows in consecutive slots of rows layer k), each
// position routed from the router's logits in the same kernel. A decode keeps the choices (host_sel)
// for the rows-read count.
template <typename E>
void jtokm_inject(DecoderState<E>& st, size_t l, int64_t k, const StepShape& sh) {
  DecoderActs<E>& A = st.acts;
  JTokMDims dims = jtokm_dims(st.cfg, sh.R);
  dims.V = A.max_rows;  // a slot's rows: the step's unique ids
  jtokm_mix_inject(A.h.get(), A.jtokm(), st.rows->batch().inverse, st.rows->rows(k, st.jtokm_first[l]),
                   st.w.layers[l].jtokm_scale, dims, st.s(), A.m_logits.get());
  if (!sh.count_rows) return;
  int32_t* dst = A.host_sel.get() + st.sel_slot[l] * st.settings.max_batch * dims.K;
  JTOK_CUDA_CHECK(cudaMemcpyAsync(dst, A.m_sel.get(), static_cast<size_t>(sh.R * dims.K) * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, st.s()));
}

// h -> h: the post-attention norm, the MLP / MoE update (JTok-gated where the scaler is not all 0),
// JTok-M's injection. The layer's rows are waited for here: the attention half overlaps their copy.
template <typename E>
void mlp_half(DecoderState<E>& st, size_t l, const StepShape& sh) {
  const ModelConfig& c = st.cfg;
  const DeviceLayerView<E>& W = st.w.layers[l];
  DecoderActs<E>& A = st.acts;
  const int64_t R = sh.R;
  if (!mlp_norms_inside(st, l, R))
    rmsnorm_forward(A.x.get(), A.rstd.get(), A.h.get(), W.ln2, R, c.hidden_size, static_cast<float>(c.rms_norm_eps),
                    st.s());
  const int64_t k = st.rows_layer[l];
  if (k >= 0) {
    mark(st, sh, StepMark::wait_begin, static_cast<int64_t>(l));
    st.rows->wait(k, st.s());
    mark(st, sh, StepMark::wait_end, static_cast<int64_t>(l));
  }
  if (st.jtok_gated[l]) {
    mlp_update_rows(st, l, R, A.mlp_out.get(), false);
    jtok_gate(st, l, k, R);
  } else {
    mlp_update_rows(st, l, R, A.h.get(), true);
  }
  if (W.jtokm_router) jtokm_inject(st, l, k, sh);
}

// Every layer's rows asked for on the side stream. Staged: the host gathers from the host's ids;
// else from the step's ids already on the device (acts.ids(), uploaded and checked with the step):
// no host copy or sync, which a graph capture needs.
template <typename E>
void request_rows(DecoderState<E>& st, const int32_t* tokens, const StepShape& sh) {
  const auto t0 = std::chrono::steady_clock::now();
  if (st.path == RowPath::staged) st.rows->request(tokens, sh.R, st.s());
  else st.rows->request_device(st.acts.ids(), sh.R, st.s());
  if (sh.timed)
    st.prof->add_issue_ms(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace

template <typename E>
void forward_rows(DecoderState<E>& st, const int32_t* tokens, const StepShape& sh) {
  JTOK_CHECK(sh.R > 0 && sh.R <= st.acts.max_rows, "cuda decoder: a step of ", sh.R, " rows (at most ",
             st.acts.max_rows, ")");
  // Every layer's rows are asked for now, on the side stream; the layers wait for theirs.
  if (st.rows) request_rows(st, tokens, sh);
  if (st.w.embed)
    embedding_forward(st.acts.h.get(), st.acts.ids(), st.w.embed, sh.R, st.cfg.hidden_size, st.s());
  else  // int8_only: the embedding's int8 rows
    gather_q8_rows(st.acts.h.get(), st.acts.ids(), st.q8.embed.q, st.q8.embed.scale, sh.R, st.cfg.hidden_size, st.s());
  // int8_only: a prefill (any step but a decode step, whose products are the row-invariant ones)
  // multiplies the layer's matrices dequantised into the scratch its views point at; a decode step
  // reads the int8 matrices themselves.
  const bool dequantise = st.settings.int8_only && st.q8.on() && !norm_in_product(st, sh.R);
  for (size_t l = 0; l < st.w.layers.size(); ++l) {
    mark(st, sh, StepMark::layer_begin, static_cast<int64_t>(l));
    if (dequantise) dequantize_layer(st, l);
    attention_half(st, l, sh);
    mark(st, sh, StepMark::attention_end, static_cast<int64_t>(l));
    mlp_half(st, l, sh);
  }
}

template <typename E>
void head_forward(DecoderState<E>& st, int64_t first, int64_t n) {
  DecoderActs<E>& A = st.acts;
  const ModelConfig& c = st.cfg;
  const int64_t d = c.hidden_size, Vp = c.padded_vocab();
  JTOK_CHECK(n > 0 && n <= A.head_rows && first >= 0 && first + n <= A.max_rows, "cuda decoder: the head of rows ",
             first, "..", first + n - 1);
  cudaStream_t s = st.s();
  const E* h = A.h.get() + first * d;
  // The final norm inside the LM head's product (an int8 export's: its int8 head) in a decode step, and
  // for any rows where the head is held in int8 alone (int8_only: no lm_head in the copy).
  if (norm_in_product(st, n) || !st.w.lm_head) {
    if (st.q8.on())
      row_invariant_linear_q8<E, float>(A.logits.get(), h, st.q8.head, nullptr, n, d, Vp, false, s,
                                        row_norm(st, st.w.norm));
    else
      row_invariant_product<E, float>(st.mm.row_invariant_tensor_cores(), A.logits.get(), h, st.w.lm_head, nullptr, n,
                                      d, Vp, false, s, row_norm(st, st.w.norm));
    return;
  }
  rmsnorm_forward(A.lnf.get(), A.rstd.get(), h, st.w.norm, n, d, static_cast<float>(c.rms_norm_eps), s);
  linear_forward<E, float>(st.mm, A.logits.get(), A.lnf.get(), st.w.lm_head, nullptr, n, d, Vp, false, s);
}

template <typename E>
void queue_logits_copy(DecoderState<E>& st, int64_t n) {
  DecoderActs<E>& A = st.acts;
  const int64_t V = st.cfg.vocab_size, Vp = st.cfg.padded_vocab();
  JTOK_CHECK(n > 0 && n <= A.head_rows, "cuda decoder: the logits of ", n, " rows (at most ", A.head_rows, ")");
  JTOK_CUDA_CHECK(cudaMemcpy2DAsync(A.host_logits.get(), static_cast<size_t>(V) * sizeof(float), A.logits.get(),
                                    static_cast<size_t>(Vp) * sizeof(float), static_cast<size_t>(V) * sizeof(float),
                                    static_cast<size_t>(n), cudaMemcpyDeviceToHost, st.s()));
}

template <typename E>
void head_logits(DecoderState<E>& st, int64_t first, int64_t n) {
  head_forward(st, first, n);
  queue_logits_copy(st, n);
  JTOK_CUDA_CHECK(cudaStreamSynchronize(st.s()));
}

#define JTOK_DECODER_FORWARD_INSTANTIATE(E)                                             \
  template void forward_rows<E>(DecoderState<E>&, const int32_t*, const StepShape&);    \
  template void head_forward<E>(DecoderState<E>&, int64_t, int64_t);                    \
  template void queue_logits_copy<E>(DecoderState<E>&, int64_t);                        \
  template void head_logits<E>(DecoderState<E>&, int64_t, int64_t);
JTOK_DECODER_FORWARD_INSTANTIATE(float)
JTOK_DECODER_FORWARD_INSTANTIATE(__nv_bfloat16)
#undef JTOK_DECODER_FORWARD_INSTANTIATE

}  // namespace jtok::cuda
