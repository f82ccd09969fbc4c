// The GPU model's MoE block (cuda/model.h), src/model/moe.cpp's moe_forward / moe_backward on device
// buffers: the router's product, the routing kernels (cuda/moe.h), the experts' products as one
// grouped launch a projection over every expert's rows (cuda/grouped_linear.h: the offsets stay on
// the device), SwiGLU (cuda/swiglu.h), the shared experts as one SwiGLU of width S:
//   logits (N,E) = x R^T (fp32 out); probs, topi, topw (N,K); the N K slots grouped by expert;
//   xg (NK,d) = x[slot's position]; gu (NK,2F) = xg [Wg_e; Wu_e]^T on expert e's rows (gate | up);
//   act = silu(g) * u; eo (NK,d) = act Wd_e^T; out (N,d) += shared(x), then += sum_j topw eo[row].
// E: the activations' and forward weights' type (float, the checking instantiation, or
// __nv_bfloat16); routing in fp32, weight gradients into fp32 buffers (model.h's grads).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/device_array.h"
#include "cuda/matmul.h"
#include "cuda/moe.h"
#include "cuda/row_invariant_linear.h"
#include "model/moe.h"

namespace jtok::cuda {

// One MoE block's tensors in a device flat buffer, at the host's offsets (model/moe.h's MoeWeights).
template <typename P>
struct DeviceMoeView {
  P* router = nullptr;                            // (E,d); null: not an MoE layer
  P *sg = nullptr, *su = nullptr, *sd = nullptr;  // (S,d), (S,d), (d,S); null without shared experts
  P* experts = nullptr;  // E experts back to back, each gate (F,d), up (F,d), down (d,F)
};

// An int8 export's MoE layer as a decode step reads it (the GPU decoder's int8 matrices,
// cuda/decoder_state.h's DecoderQ8): the routed experts' gate | up (2F,d) and down (d,F) of expert 0,
// expert e's values e values_stride and its scales e scale_stride further on; the shared experts'
// gate | up (2S,d) and down (d,S) (q null without shared experts).
struct MoeQ8 {
  Q8Weight gate_up, down, shared_gate_up, shared_down;
  int64_t values_stride = 0, scale_stride = 0;
};

// What one MoE layer's forward keeps for its backward (N positions, NK = N K slots).
template <typename E>
struct DeviceMoeActs {
  DeviceArray<float> probs, topw, frac;                 // (N,E), (N,K), (E)
  DeviceArray<int32_t> topi, offsets, slot_of, row_of;  // (N,K), (E+1), (NK), (NK)
  DeviceArray<int32_t> experts, num_experts;            // (NK) bound, (1): the experts with rows
  DeviceArray<double> aux;                              // (1) the block's aux loss, coef included
  DeviceArray<E> xg, gu, act, eo;                       // (NK,d), (NK,2F) gate | up, (NK,F), (NK,d)
  DeviceArray<E> sg, su, sact;                          // shared experts: (N,S) x3
  MoeDeviceRoute route() const {
    return {probs.get(), topi.get(), topw.get(), offsets.get(), slot_of.get(), row_of.get(),
            frac.get(),  aux.get(),  experts.get(), num_experts.get()};
  }
};

// Scratch shared by the MoE layers of one micro-batch (forward: logits, moe_group's; backward: the rest).
template <typename E>
struct DeviceMoeScratch {
  DeviceArray<float> logits, dlogits;     // (N,E) each
  DeviceArray<E> dlogits_e;               // (N,E) E = bf16 only: dlogits as the router products' operand
  DeviceArray<uint8_t> group;             // moe_group's scratch
  DeviceArray<E> deo, dact, dgu, dxg;     // (NK,d), (NK,F), (NK,2F) gate | up, (NK,d)
  DeviceArray<E> dsact, dsg, dsu;         // shared experts: (N,S) x3
};

// Sizes a layer's activations / the shared scratch for N positions (no-ops when already so).
template <typename E>
void size_moe_acts(DeviceMoeActs<E>& a, const MoeDims& m, int64_t N);
template <typename E>
void size_moe_scratch(DeviceMoeScratch<E>& s, const MoeDims& m, int64_t N);

// x (N,d) -> out (N,d) += the block's output; a keeps routing and activations, a.aux set. No host
// sync. A decode step (N <= mm.row_invariant_rows()) takes the row-invariant grouped products
// (cuda/row_invariant_linear.h: a.gu unwritten; no backward follows), of q8's int8 experts where
// given (else of w's; any other step reads w).
template <typename E>
void moe_block_forward(Matmul& mm, E* out, DeviceMoeActs<E>& a, DeviceMoeScratch<E>& s, const E* x,
                       const DeviceMoeView<E>& w, const MoeDims& m, int64_t N, cudaStream_t stream,
                       const MoeQ8* q8 = nullptr);

// dout = dL/d(block output) (N,d) -> dx (N,d) += dL/dx; g's tensors += their gradients. aux_grad:
// dL/d(a.aux), the step loss's weight on this block's aux term.
template <typename E>
void moe_block_backward(Matmul& mm, E* dx, const DeviceMoeView<float>& g, DeviceMoeScratch<E>& s, const E* dout,
                        const E* x, const DeviceMoeActs<E>& a, const DeviceMoeView<E>& w, const MoeDims& m, int64_t N,
                        float aux_grad, cudaStream_t stream);

}  // namespace jtok::cuda
