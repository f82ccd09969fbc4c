// MoE routing on the GPU, src/model/moe.cpp's arithmetic (DeepSeekMoE-style: softmax router over E
// routed experts, top-K with ties to the lower index, optional renormalisation, the switch-style
// aux loss coef * E * sum_i f_i P_i): routing, the grouping of the N*K slots by expert (stable: an
// expert's rows in slot order, by dedup.h's sort), the gather of each expert's tokens into one
// block, the weighted combine, and their backward. The products (router, experts' gate / up / down)
// are the caller's: one GEMM per expert over rows offsets[e] .. offsets[e+1] (copy offsets to the
// host) or a grouped GEMM; SwiGLU between them is swiglu.h's.
// Routing is fp32; gather / combine take T = float or __nv_bfloat16 activations.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace jtok::cuda {

constexpr int64_t kMoeMaxTopK = 32;  // K bound of the kernels (the combine's backward holds K sums in shared memory)

struct MoeRouteDims {
  int64_t N = 0, E = 0, K = 0;
  bool norm_topk = false;
  double aux_coef = 0;
};

// The routing of one block's N positions (device arrays, sized by the caller). A slot is (n, j),
// index n*K + j; a row is a slot's place in the expert-grouped block.
struct MoeDeviceRoute {
  float* probs = nullptr;      // (N,E) router softmax
  int32_t* topi = nullptr;     // (N,K) chosen experts, descending probability
  float* topw = nullptr;       // (N,K) their weights
  int32_t* offsets = nullptr;  // (E+1) expert e owns rows offsets[e] .. offsets[e+1]-1
  int32_t* slot_of = nullptr;  // (N*K) row -> slot
  int32_t* row_of = nullptr;   // (N*K) slot -> row
  float* frac = nullptr;       // (E) f_i = slots routed to i / (N*K)
  double* aux = nullptr;       // (1) this block's aux loss, coef included
  // The experts with rows, ascending, and their count (moe_group; null: kept in its scratch only):
  // what a grouped product's blocks walk (cuda/row_invariant_linear.h).
  int32_t* experts = nullptr;      // (N*K) bound
  int32_t* num_experts = nullptr;  // (1)
};

// logits (N,E) (x @ router^T) -> probs, topi, topw.
void moe_route(const MoeDeviceRoute& r, const float* logits, const MoeRouteDims& m, cudaStream_t stream);

// Bytes of scratch moe_group needs.
size_t moe_group_scratch_bytes(const MoeRouteDims& m);

// topi, probs -> offsets, slot_of, row_of, frac, aux (and experts, num_experts where set).
void moe_group(const MoeDeviceRoute& r, void* scratch, size_t scratch_bytes, const MoeRouteDims& m, cudaStream_t stream);

// x (N,d) -> xg (N*K, d): row r = x[slot_of[r] / K].
template <typename T>
void moe_gather(T* xg, const T* x, const MoeDeviceRoute& r, const MoeRouteDims& m, int64_t d, cudaStream_t stream);

// eo (N*K, d) the experts' outputs by row -> out (N,d) += sum_j topw[n,j] * eo[row_of[n*K+j]], j in order.
template <typename T>
void moe_combine(T* out, const T* eo, const MoeDeviceRoute& r, const MoeRouteDims& m, int64_t d, cudaStream_t stream);

// dout (N,d), eo -> deo (N*K, d) = w * dout by row; dlogits (N,E) = dL/d(router logits) through the
// weights (top-K fixed), the aux loss (aux_grad = dL/d aux) and the softmax. The caller then adds
// the router's products (dx += dlogits @ router, drouter += dlogits^T @ x).
template <typename T>
void moe_combine_backward(T* deo, float* dlogits, const T* dout, const T* eo, const MoeDeviceRoute& r,
                          const MoeRouteDims& m, int64_t d, float aux_grad, cudaStream_t stream);

// dxg (N*K, d) the experts' input gradients by row -> dx (N,d) += sum_j dxg[row_of[n*K+j]], j in order.
template <typename T>
void moe_scatter_backward(T* dx, const T* dxg, const MoeDeviceRoute& r, const MoeRouteDims& m, int64_t d,
                          cudaStream_t stream);

}  // namespace jtok::cuda
