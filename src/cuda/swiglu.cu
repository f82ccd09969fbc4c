// SwiGLU forward and backward (src/cuda/swiglu.h): one thread an element, sigmoid by expf.
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/pdl.cuh"
#include "cuda/swiglu.h"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t N, int64_t F, int64_t ld) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * F) return;
  const int64_t at = (i / F) * ld + i % F;
  out[i] = from_f32<T>(swiglu_value(to_f32(gate[at]), to_f32(up[at])));
}

// d silu(g)/dg = s (1 + g (1 - s)), s = sigmoid(g)
template <typename T>
__global__ void __launch_bounds__(kThreads) swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate,
                                                                   const T* up, int64_t N, int64_t F, int64_t ld) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * F) return;
  const int64_t at = (i / F) * ld + i % F;
  const float g = to_f32(gate[at]), dy = to_f32(dout[i]);
  const float s = 1.0f / (1.0f + expf(-g));
  dup[at] = from_f32<T>(dy * (g * s));
  dgate[at] = from_f32<T>(dy * to_f32(up[at]) * s * (1.0f + g * (1.0f - s)));
}

}  // namespace

template <typename T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t N, int64_t F, int64_t ld, cudaStream_t stream) {
  if (N * F == 0) return;
  swiglu_forward_kernel<T><<<ceil_div(N * F, kThreads), kThreads, 0, stream>>>(out, gate, up, N, F, ld);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t N, int64_t F, int64_t ld,
                     cudaStream_t stream) {
  if (N * F == 0) return;
  swiglu_backward_kernel<T><<<ceil_div(N * F, kThreads), kThreads, 0, stream>>>(dgate, dup, dout, gate, up, N, F, ld);
  JTOK_CUDA_CHECK_LAUNCH();
}

template void swiglu_forward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t, cudaStream_t);
template void swiglu_forward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int64_t,
                                            int64_t, int64_t, cudaStream_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*, int64_t, int64_t,
                                     int64_t, cudaStream_t);
template void swiglu_backward<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, const __nv_bfloat16*,
                                             const __nv_bfloat16*, const __nv_bfloat16*, int64_t, int64_t, int64_t,
                                             cudaStream_t);

}  // namespace jtok::cuda
