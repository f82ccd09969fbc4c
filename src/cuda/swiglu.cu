// SwiGLU forward and backward (src/cuda/swiglu.h), sigmoid by expf: a thread a 16-byte vector of
// each row (cuda/vec.h) where the rows and pointers allow, else a thread an element; one
// expression an element either way (swiglu_value, swiglu_grads), so the same bits.
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/pdl.cuh"
#include "cuda/swiglu.h"
#include "cuda/vec.cuh"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;

// d silu(g)/dg = s (1 + g (1 - s)), s = sigmoid(g): dup = dy silu(g), dgate = dy up silu'(g).
__device__ __forceinline__ void swiglu_grads(float& dg, float& du, float g, float u, float dy) {
  const float s = 1.0f / (1.0f + expf(-g));
  du = dy * (g * s);
  dg = dy * u * s * (1.0f + g * (1.0f - s));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t N, int64_t F, int64_t ld) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * F) return;
  const int64_t at = (i / F) * ld + i % F;
  out[i] = from_f32<T>(swiglu_value(to_f32(gate[at]), to_f32(up[at])));
}

// Thread k: out[k V .. k V + V) of out (N,F), V = kVec<T>; F and ld multiples of V, pointers aligned.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_vec_kernel(T* out, const T* gate, const T* up, int64_t N, int64_t F, int64_t ld) {
  pdl_wait();
  constexpr int V = kVec<T>;
  VecSlot t;
  if (!vec_slot<T>(t, N, F)) return;
  const int64_t at = t.row * ld + t.col;
  float g[V], u[V], o[V];
  load_vec(g, gate + at);
  load_vec(u, up + at);
#pragma unroll
  for (int v = 0; v < V; ++v) o[v] = swiglu_value(g[v], u[v]);
  store_vec(out + t.k * V, o);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate,
                                                                   const T* up, int64_t N, int64_t F, int64_t ld) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * F) return;
  const int64_t at = (i / F) * ld + i % F;
  float dg, du;
  swiglu_grads(dg, du, to_f32(gate[at]), to_f32(up[at]), to_f32(dout[i]));
  dup[at] = from_f32<T>(du);
  dgate[at] = from_f32<T>(dg);
}

// Thread k: the vector swiglu_forward_vec_kernel's thread k writes, backward.
template <typename T>
__global__ void __launch_bounds__(kThreads) swiglu_backward_vec_kernel(T* dgate, T* dup, const T* dout, const T* gate,
                                                                       const T* up, int64_t N, int64_t F, int64_t ld) {
  pdl_wait();
  constexpr int V = kVec<T>;
  VecSlot t;
  if (!vec_slot<T>(t, N, F)) return;
  const int64_t at = t.row * ld + t.col;
  float g[V], u[V], dy[V], dg[V], du[V];
  load_vec(g, gate + at);
  load_vec(u, up + at);
  load_vec(dy, dout + t.k * V);
#pragma unroll
  for (int v = 0; v < V; ++v) swiglu_grads(dg[v], du[v], g[v], u[v], dy[v]);
  store_vec(dup + at, du);
  store_vec(dgate + at, dg);
}

}  // namespace

template <typename T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t N, int64_t F, int64_t ld, cudaStream_t stream) {
  if (N * F == 0) return;
  if (vec_fits<T>({out, gate, up}, {F, ld}))
    swiglu_forward_vec_kernel<T><<<ceil_div(N * F / kVec<T>, kThreads), kThreads, 0, stream>>>(out, gate, up, N, F, ld);
  else
    swiglu_forward_kernel<T><<<ceil_div(N * F, kThreads), kThreads, 0, stream>>>(out, gate, up, N, F, ld);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t N, int64_t F, int64_t ld,
                     cudaStream_t stream) {
  if (N * F == 0) return;
  if (vec_fits<T>({dgate, dup, dout, gate, up}, {F, ld}))
    swiglu_backward_vec_kernel<T>
        <<<ceil_div(N * F / kVec<T>, kThreads), kThreads, 0, stream>>>(dgate, dup, dout, gate, up, N, F, ld);
  else
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
