// The GPU model's MoE block (src/cuda/model_moe.h), model/moe.cpp's steps in its order: forward =
// router product, route, group, gather, the experts' gate / up, SwiGLU, down (each one grouped launch
// over every expert by the device's offsets: cuda/grouped_linear.h; a decode step: gate | up with
// SwiGLU, then down, row-invariant), shared experts onto out, combine onto out; backward = combine's
// backward (dL/deo and the router logits' gradient, aux loss included), the router's products, the
// experts' down, SwiGLU, gate / up (grouped: input and weight gradients), the rows' input gradients
// back to their positions, shared experts. Every gradient accumulates (+=), as the CPU's.
#include <algorithm>
#include <type_traits>

#include "cuda/decoder_sizes.h"
#include "cuda/grouped_linear.h"
#include "cuda/model_kernels.h"
#include "cuda/model_moe.h"
#include "cuda/row_invariant_linear.h"
#include "cuda/swiglu.h"

namespace jtok::cuda {

namespace {

enum ExpertMatrix : int64_t { kGate = 0, kUp = 1, kDown = 2 };

// Elements between two experts' weights: gate (F,d), up (F,d), down (d,F), back to back an expert.
int64_t expert_stride(const MoeDims& m) { return 3 * m.F * m.d; }

// Expert 0's matrix p in a view (expert e's is e expert_stride further on).
template <typename P>
P* expert_matrix(const DeviceMoeView<P>& w, const MoeDims& m, ExpertMatrix p) {
  return w.experts ? w.experts + p * m.F * m.d : nullptr;  // null: frozen experts' gradients
}

MoeRouteDims route_dims(const MoeDims& m, int64_t N) { return {N, m.E, m.K, m.norm_topk, m.aux_coef}; }

// The grouped block's rows by expert (moe_group's offsets, on the device) for the grouped products.
template <typename E>
ExpertGroups expert_groups(const DeviceMoeActs<E>& a, const MoeDims& m, int64_t N) {
  return {a.offsets.get(), m.E, N * m.K, expert_stride(m)};
}

// The router's product and the routing: a's probs, topi, topw, offsets, slot_of, row_of, frac, aux,
// experts, num_experts (all on the device).
template <typename E>
void route_and_group(Matmul& mm, DeviceMoeActs<E>& a, DeviceMoeScratch<E>& s, const E* x, const DeviceMoeView<E>& w,
                     const MoeDims& m, int64_t N, cudaStream_t stream) {
  const MoeRouteDims rd = route_dims(m, N);
  linear_forward<E, float>(mm, s.logits.get(), x, w.router, nullptr, N, m.d, m.E, false, stream);
  moe_route(a.route(), s.logits.get(), rd, stream);
  moe_group(a.route(), s.group.get(), s.group.bytes(), rd, stream);
}

// a.xg (NK,d) -> a.gu (NK,2F) -> a.act (NK,F) -> a.eo (NK,d): gate | up as one grouped product (an
// expert's gate and up weights lie back to back: one (2F,d) matrix), SwiGLU, down.
template <typename E>
void routed_experts_forward(DeviceMoeActs<E>& a, const DeviceMoeView<E>& w, const MoeDims& m, int64_t N,
                            cudaStream_t stream) {
  const int64_t d = m.d, F = m.F;
  const ExpertGroups groups = expert_groups(a, m, N);
  grouped_linear_forward<E>(a.gu.get(), a.xg.get(), expert_matrix(w, m, kGate), groups, d, 2 * F, stream);
  swiglu_forward(a.act.get(), a.gu.get(), a.gu.get() + F, N * m.K, F, 2 * F, stream);
  grouped_linear_forward<E>(a.eo.get(), a.act.get(), expert_matrix(w, m, kDown), groups, F, d, stream);
}

// A decode step's routed experts (N <= mm.row_invariant_rows(), cuda/matmul.h): a.xg (NK,d) ->
// a.act (NK,F) by each expert's gate | up weight (back to back: (2F,d)) with SwiGLU, -> a.eo (NK,d),
// each one launch over the experts with rows (moe_group's list and offsets, on the device: no host
// copy, so a CUDA graph holds the block; a.gu unwritten). A row's bits: row_invariant_linear's
// products by its expert's weights alone, SwiGLU between them (cuda/row_invariant_linear.h), not
// routed_experts_forward's grouped products (prefill, training). q8: the int8 experts, as stored.
template <typename E>
void routed_experts_rows(DeviceMoeActs<E>& a, const DeviceMoeView<E>& w, const MoeDims& m, int64_t N, const MoeQ8* q8,
                         cudaStream_t stream) {
  const int64_t d = m.d, F = m.F;
  // An expert gets at most N rows (a position picks K distinct experts); at most min(E, NK) have any.
  ExpertRows groups{a.offsets.get(), a.experts.get(), a.num_experts.get(), std::min(m.E, N * m.K), N, expert_stride(m)};
  if (q8) {
    groups.stride = q8->values_stride, groups.scale_stride = q8->scale_stride;
    row_invariant_expert_swiglu_q8<E>(a.act.get(), a.xg.get(), q8->gate_up, groups, d, F, stream);
    row_invariant_expert_linear_q8<E>(a.eo.get(), a.act.get(), q8->down, groups, F, d, stream);
    return;
  }
  row_invariant_expert_swiglu<E>(a.act.get(), a.xg.get(), expert_matrix(w, m, kGate), groups, d, F, stream);
  row_invariant_expert_linear<E, E>(a.eo.get(), a.act.get(), expert_matrix(w, m, kDown), groups, F, d, stream);
}

// Shared experts: out (N,d) += down(silu(x Wsg^T) * x Wsu^T), width S. A decode step's of q8's int8
// weights: gate | up with SwiGLU in one product (the bits of the two products and swiglu_forward).
template <typename E>
void shared_experts_forward(Matmul& mm, E* out, DeviceMoeActs<E>& a, const E* x, const DeviceMoeView<E>& w,
                            const MoeDims& m, int64_t N, const MoeQ8* q8, cudaStream_t stream) {
  const int64_t d = m.d, S = m.S;
  if (q8) {
    row_invariant_swiglu_q8<E>(a.sact.get(), x, q8->shared_gate_up, N, d, S, stream);
    row_invariant_linear_q8<E, E>(out, a.sact.get(), q8->shared_down, nullptr, N, S, d, true, stream);
    return;
  }
  linear_forward<E, E>(mm, a.sg.get(), x, w.sg, nullptr, N, d, S, false, stream);
  linear_forward<E, E>(mm, a.su.get(), x, w.su, nullptr, N, d, S, false, stream);
  swiglu_forward(a.sact.get(), a.sg.get(), a.su.get(), N, S, S, stream);
  linear_forward<E, E>(mm, out, a.sact.get(), w.sd, nullptr, N, S, d, true, stream);
}

// The router's products from s.dlogits (N,E): dx (N,d) += dlogits R, dR (E,d) += dlogits^T x (bf16:
// dlogits rounded to bf16 first, the products' operand type).
template <typename E>
void router_backward(Matmul& mm, E* dx, float* drouter, DeviceMoeScratch<E>& s, const E* x, const E* router,
                     const MoeDims& m, int64_t N, cudaStream_t stream) {
  const E* dlogits = nullptr;
  if constexpr (std::is_same_v<E, float>) {
    dlogits = s.dlogits.get();
  } else {
    convert_from_f32(s.dlogits_e.get(), s.dlogits.get(), N * m.E, stream);
    dlogits = s.dlogits_e.get();
  }
  linear_backward<E, float>(mm, dx, drouter, dlogits, x, router, N, m.d, m.E, stream);
}

// s.deo (NK,d) -> s.dact (NK,F) -> s.dgu (NK,2F) -> s.dxg (NK,d), the experts' weight gradients +=
// (grouped: input and weight gradients; gate | up as one (2F,d) matrix).
template <typename E>
void routed_experts_backward(const DeviceMoeView<float>& g, DeviceMoeScratch<E>& s, const DeviceMoeActs<E>& a,
                             const DeviceMoeView<E>& w, const MoeDims& m, int64_t N, cudaStream_t stream) {
  const int64_t d = m.d, F = m.F;
  const ExpertGroups groups = expert_groups(a, m, N);
  s.dact.zero(stream);  // the products accumulate
  grouped_linear_backward<E>(s.dact.get(), expert_matrix(g, m, kDown), s.deo.get(), a.act.get(),
                             expert_matrix(w, m, kDown), groups, F, d, stream);
  swiglu_backward(s.dgu.get(), s.dgu.get() + F, s.dact.get(), a.gu.get(), a.gu.get() + F, N * m.K, F, 2 * F, stream);
  s.dxg.zero(stream);
  grouped_linear_backward<E>(s.dxg.get(), expert_matrix(g, m, kGate), s.dgu.get(), a.xg.get(),
                             expert_matrix(w, m, kGate), groups, d, 2 * F, stream);
}

// Shared experts: dout (N,d) -> dx (N,d) +=, their weight gradients +=.
template <typename E>
void shared_experts_backward(Matmul& mm, E* dx, const DeviceMoeView<float>& g, DeviceMoeScratch<E>& s, const E* dout,
                             const E* x, const DeviceMoeActs<E>& a, const DeviceMoeView<E>& w, const MoeDims& m,
                             int64_t N, cudaStream_t stream) {
  const int64_t d = m.d, S = m.S;
  s.dsact.zero(stream);
  linear_backward<E, float>(mm, s.dsact.get(), g.sd, dout, a.sact.get(), w.sd, N, S, d, stream);
  swiglu_backward(s.dsg.get(), s.dsu.get(), s.dsact.get(), a.sg.get(), a.su.get(), N, S, S, stream);
  linear_backward<E, float>(mm, dx, g.sg, s.dsg.get(), x, w.sg, N, d, S, stream);
  linear_backward<E, float>(mm, dx, g.su, s.dsu.get(), x, w.su, N, d, S, stream);
}

}  // namespace

template <typename E>
void size_moe_acts(DeviceMoeActs<E>& a, const MoeDims& m, int64_t N) {
  const MoeActSizes z = moe_act_sizes(m, N);  // the decoder's memory plan counts the same
  a.probs.resize(z.probs), a.topw.resize(z.topw), a.frac.resize(z.frac);
  a.topi.resize(z.topi), a.offsets.resize(z.offsets), a.slot_of.resize(z.slot_of), a.row_of.resize(z.row_of);
  a.experts.resize(z.experts), a.num_experts.resize(z.num_experts);
  a.aux.resize(z.aux);
  a.xg.resize(z.xg), a.gu.resize(z.gu), a.act.resize(z.act), a.eo.resize(z.eo);
  a.sg.resize(z.sg), a.su.resize(z.su), a.sact.resize(z.sact);
}

template <typename E>
void size_moe_scratch(DeviceMoeScratch<E>& s, const MoeDims& m, int64_t N) {
  const int64_t NK = N * m.K;
  s.logits.resize(N * m.E), s.dlogits.resize(N * m.E);
  s.dlogits_e.resize(std::is_same_v<E, float> ? 0 : N * m.E);
  s.group.resize(N > 0 ? static_cast<int64_t>(moe_group_scratch_bytes(route_dims(m, N))) : 0);
  s.deo.resize(NK * m.d), s.dact.resize(NK * m.F), s.dgu.resize(NK * 2 * m.F);
  s.dxg.resize(NK * m.d);
  s.dsact.resize(N * m.S), s.dsg.resize(N * m.S), s.dsu.resize(N * m.S);
}

template <typename E>
void moe_block_forward(Matmul& mm, E* out, DeviceMoeActs<E>& a, DeviceMoeScratch<E>& s, const E* x,
                       const DeviceMoeView<E>& w, const MoeDims& m, int64_t N, cudaStream_t stream, const MoeQ8* q8) {
  const bool rows = N <= mm.row_invariant_rows();  // a decode step
  if (!rows) q8 = nullptr;
  route_and_group(mm, a, s, x, w, m, N, stream);
  moe_gather(a.xg.get(), x, a.route(), route_dims(m, N), m.d, stream);
  if (rows)
    routed_experts_rows(a, w, m, N, q8, stream);
  else
    routed_experts_forward(a, w, m, N, stream);
  if (m.S > 0) shared_experts_forward(mm, out, a, x, w, m, N, q8, stream);
  moe_combine(out, a.eo.get(), a.route(), route_dims(m, N), m.d, stream);
}

template <typename E>
void moe_block_backward(Matmul& mm, E* dx, const DeviceMoeView<float>& g, DeviceMoeScratch<E>& s, const E* dout,
                        const E* x, const DeviceMoeActs<E>& a, const DeviceMoeView<E>& w, const MoeDims& m, int64_t N,
                        float aux_grad, cudaStream_t stream) {
  const MoeRouteDims rd = route_dims(m, N);
  moe_combine_backward(s.deo.get(), s.dlogits.get(), dout, a.eo.get(), a.route(), rd, m.d, aux_grad, stream);
  router_backward(mm, dx, g.router, s, x, w.router, m, N, stream);
  routed_experts_backward(g, s, a, w, m, N, stream);
  moe_scatter_backward(dx, s.dxg.get(), a.route(), rd, m.d, stream);
  if (m.S > 0) shared_experts_backward(mm, dx, g, s, dout, x, a, w, m, N, stream);
}

#define JTOK_MODEL_MOE_INSTANTIATE(E)                                                                               \
  template void size_moe_acts<E>(DeviceMoeActs<E>&, const MoeDims&, int64_t);                                       \
  template void size_moe_scratch<E>(DeviceMoeScratch<E>&, const MoeDims&, int64_t);                                 \
  template void moe_block_forward<E>(Matmul&, E*, DeviceMoeActs<E>&, DeviceMoeScratch<E>&, const E*,                \
                                     const DeviceMoeView<E>&, const MoeDims&, int64_t, cudaStream_t, const MoeQ8*); \
  template void moe_block_backward<E>(Matmul&, E*, const DeviceMoeView<float>&, DeviceMoeScratch<E>&, const E*,     \
                                      const E*, const DeviceMoeActs<E>&, const DeviceMoeView<E>&, const MoeDims&,   \
                                      int64_t, float, cudaStream_t);
JTOK_MODEL_MOE_INSTANTIATE(float)
JTOK_MODEL_MOE_INSTANTIATE(__nv_bfloat16)
#undef JTOK_MODEL_MOE_INSTANTIATE

}  // namespace jtok::cuda
