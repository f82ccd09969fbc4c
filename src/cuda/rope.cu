// RoPE forward and backward (src/cuda/rope.h): one thread a rotated pair (x_i, x_{i+hd/2}), or
// 16 bytes of pairs where the rows allow (cuda/vec.h).
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/pdl.cuh"
#include "cuda/rope.h"
#include "cuda/vec.cuh"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;

// Pair p of B*T*H*half: token bt = p / (H*half), head h, index i; sign +1 forward, -1 backward.
template <typename S>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(S* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t stride,
                int64_t pos0, float sign) {
  pdl_wait();
  const int64_t half = hd / 2;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= B * T * H * half) return;
  const int64_t i = p % half, h = (p / half) % H, bt = p / (half * H), t = bt % T;
  S* v = x + bt * stride + h * hd;
  const float c = cos[(pos0 + t) * half + i], s = sign * sin[(pos0 + t) * half + i];
  float y1, y2;
  rope_rotate(to_f32(v[i]), to_f32(v[i + half]), c, s, y1, y2);
  v[i] = from_f32<S>(y1);
  v[i + half] = from_f32<S>(y2);
}

// The same a thread V = kVec<S> pairs, i .. i + V - 1 of one head (half, hd, stride multiples of V; x,
// cos, sin 16-byte aligned).
template <typename S>
__global__ void __launch_bounds__(kThreads)
    rope_vec_kernel(S* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H, int64_t hd,
                    int64_t stride, int64_t pos0, float sign) {
  pdl_wait();
  constexpr int V = kVec<S>;
  const int64_t half = hd / 2;
  VecSlot q;  // a row a (token, head), its pairs' first halves the columns
  if (!vec_slot<S>(q, B * T * H, half)) return;
  const int64_t i = q.col, bt = q.row / H, h = q.row - bt * H, t = bt % T;
  S* v = x + bt * stride + h * hd;
  float x1[V], x2[V], c[V], s[V];
  load_vec(x1, v + i);
  load_vec(x2, v + i + half);
  load_vecs(c, cos + (pos0 + t) * half + i);
  load_vecs(s, sin + (pos0 + t) * half + i);
#pragma unroll
  for (int k = 0; k < V; ++k) rope_rotate(x1[k], x2[k], c[k], sign * s[k], x1[k], x2[k]);
  store_vec(v + i, x1);
  store_vec(v + i + half, x2);
}

template <typename S>
void launch(S* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t stride,
            int64_t pos0, float sign, cudaStream_t stream) {
  const int64_t pairs = B * T * H * (hd / 2);
  if (pairs == 0) return;
  if (vec_fits<S>({x, cos, sin}, {hd / 2, hd, stride}))
    rope_vec_kernel<S>
        <<<ceil_div(pairs / kVec<S>, kThreads), kThreads, 0, stream>>>(x, cos, sin, B, T, H, hd, stride, pos0, sign);
  else
    rope_kernel<S><<<ceil_div(pairs, kThreads), kThreads, 0, stream>>>(x, cos, sin, B, T, H, hd, stride, pos0, sign);
  JTOK_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename S>
void rope_forward(S* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H, int64_t hd,
                  int64_t stride, int64_t pos0, cudaStream_t stream) {
  launch(x, cos, sin, B, T, H, hd, stride, pos0, 1.0f, stream);
}

template <typename S>
void rope_backward(S* dx, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H, int64_t hd,
                   int64_t stride, cudaStream_t stream) {
  launch(dx, cos, sin, B, T, H, hd, stride, 0, -1.0f, stream);
}

template void rope_forward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                  int64_t, cudaStream_t);
template void rope_forward<__nv_bfloat16>(__nv_bfloat16*, const float*, const float*, int64_t, int64_t, int64_t,
                                          int64_t, int64_t, int64_t, cudaStream_t);
template void rope_backward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                   cudaStream_t);
template void rope_backward<__nv_bfloat16>(__nv_bfloat16*, const float*, const float*, int64_t, int64_t, int64_t,
                                           int64_t, int64_t, cudaStream_t);

}  // namespace jtok::cuda
