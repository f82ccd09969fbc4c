// MoE's expert products over rows grouped by expert on the device (cuda/moe.h's moe_group: expert e
// owns rows offsets[e] .. offsets[e+1] - 1 of the grouped block; its weight (OC,C) lies at w + e
// stride): one launch a product for all experts, the offsets read by the kernel (no host copy, no
// sync, no per-expert launch or cuBLASLt plan), no atomics:
//   forward:   y (rows_e, OC) = x (rows_e, C) W_e^T                     (y overwritten)
//   backward:  dx (rows_e, C) += dy (rows_e, OC) W_e;  dW_e (OC,C) fp32 += dy^T x over the expert's rows
// Tiles of 64 x 64 outputs, 32 of the sum at a time, in order: the bits do not depend on the run.
// T: float (CUDA cores, fp32 sums; the checking instantiation) or __nv_bfloat16 (mma.sync m16n8k16,
// fp32 accumulation, each output rounded once). Any C, OC (no alignment asked of rows).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace jtok::cuda {

struct ExpertGroups {
  const int32_t* offsets = nullptr;  // (E+1) on the device, offsets[0] = 0
  int64_t E = 0;                     // experts
  int64_t rows = 0;                  // grouped rows, offsets[E] (a bound for the launch's blocks)
  int64_t stride = 0;                // elements between two experts' weights (and gradients)
};

template <typename T>
void grouped_linear_forward(T* y, const T* x, const T* w, const ExpertGroups& g, int64_t C, int64_t OC,
                            cudaStream_t stream);

// dx += dy W_e by rows; dw (fp32, the weights' layout) += dy^T x per expert, unless null (frozen).
template <typename T>
void grouped_linear_backward(T* dx, float* dw, const T* dy, const T* x, const T* w, const ExpertGroups& g, int64_t C,
                             int64_t OC, cudaStream_t stream);

}  // namespace jtok::cuda
