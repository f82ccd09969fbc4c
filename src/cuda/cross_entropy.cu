// Cross-entropy (one block a row) and the chunked LM head + cross-entropy (src/cuda/cross_entropy.h).
// The row's max and sum of exp come from one online pass: each thread keeps (max, sum) of its
// columns, merged across the block in a fixed tree (deterministic). The gradient's pass moves 16
// bytes a thread where the rows allow (cuda/vec.h).
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/cross_entropy.h"
#include "cuda/pdl.cuh"
#include "cuda/vec.cuh"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 512;

// (m, s) merged with (m2, s2): the running max and the sum of exp(x - max).
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  s = (m == -INFINITY ? 0.0f : s * expf(m - mx)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mx));
  m = mx;
}

// (m, s) with one more column x: one exp (the sum is rescaled only when the max moves).
__device__ __forceinline__ void add_column(float& m, float& s, float x) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;  // m = -inf at the start: 0 * 0 + 1
    m = x;
  } else {
    s += expf(x - m);
  }
}

// The block's (max, sum exp) of x[0..V): every thread gets them.
__device__ void block_max_sum(float& m, float& s, float* sm, float* ss) {
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, m2, s2);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sm[warp] = m, ss[warp] = s;
  __syncthreads();
  m = -INFINITY, s = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) merge(m, s, sm[w], ss[w]);  // the same order in every thread
}

// Column j's gradient: softmax_j * grad_scale, less grad_scale at the target; 0 past V (the padding).
__device__ __forceinline__ float dlogit(float x, int64_t j, int64_t V, int32_t y, float m, float scale,
                                        float grad_scale) {
  return j < V ? expf(x - m) * scale - (j == y ? grad_scale : 0.0f) : 0.0f;
}

// Row blockIdx.x's loss and gradient. Vec: the gradient's pass a 16-byte vector a thread
// (cuda/vec.cuh; Vp a multiple of it, rows aligned), the same columns' values as an element a thread.
template <typename T, bool Vec>
__device__ __forceinline__ void cross_entropy_row(T* dlogits, float* losses, const T* logits, const int32_t* targets,
                                                  int64_t V, int64_t Vp, float grad_scale) {
  __shared__ float sm[32], ss[32];
  const int64_t n = blockIdx.x;
  const T* x = logits + n * Vp;
  const int32_t y = targets[n];
  const float target_logit = to_f32(x[y]);  // read before an in-place write overwrites it
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) add_column(m, s, to_f32(x[j]));
  block_max_sum(m, s, sm, ss);
  if (threadIdx.x == 0) losses[n] = m + logf(s) - target_logit;
  if (!dlogits) return;
  __syncthreads();  // every thread has read x[y] before anyone overwrites the row
  T* d = dlogits + n * Vp;
  const float scale = grad_scale / s;
  if constexpr (Vec) {
    constexpr int W = kVec<T>;
    for (int64_t j0 = static_cast<int64_t>(threadIdx.x) * W; j0 < Vp; j0 += static_cast<int64_t>(blockDim.x) * W) {
      float v[W];
      load_vec(v, x + j0);
#pragma unroll
      for (int e = 0; e < W; ++e) v[e] = dlogit(v[e], j0 + e, V, y, m, scale, grad_scale);
      store_vec(d + j0, v);
    }
  } else {
    for (int64_t j = threadIdx.x; j < Vp; j += blockDim.x)
      d[j] = from_f32<T>(dlogit(to_f32(x[j]), j, V, y, m, scale, grad_scale));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(T* dlogits, float* losses, const T* logits, const int32_t* targets, int64_t V, int64_t Vp,
                         float grad_scale) {
  pdl_wait();
  cross_entropy_row<T, false>(dlogits, losses, logits, targets, V, Vp, grad_scale);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_vec_kernel(T* dlogits, float* losses, const T* logits, const int32_t* targets, int64_t V, int64_t Vp,
                             float grad_scale) {
  pdl_wait();
  cross_entropy_row<T, true>(dlogits, losses, logits, targets, V, Vp, grad_scale);
}

}  // namespace

template <typename T>
void cross_entropy(T* dlogits, float* losses, const T* logits, const int32_t* targets, int64_t N, int64_t V,
                   int64_t Vp, float grad_scale, cudaStream_t stream) {
  if (N == 0) return;
  if (dlogits && vec_fits<T>({dlogits, logits}, {Vp}))
    cross_entropy_vec_kernel<T>
        <<<static_cast<int>(N), kThreads, 0, stream>>>(dlogits, losses, logits, targets, V, Vp, grad_scale);
  else
    cross_entropy_kernel<T>
        <<<static_cast<int>(N), kThreads, 0, stream>>>(dlogits, losses, logits, targets, V, Vp, grad_scale);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename T>
void lm_head_cross_entropy(float* losses, T* dh, float* dW, const T* h, const T* W, const int32_t* targets, int64_t N,
                           int64_t C, int64_t V, int64_t Vp, float grad_scale, T* logits_chunk, int64_t chunk_rows,
                           const LmHeadGemms<T>& gemm, cudaStream_t stream, bool add_to_dW) {
  JTOK_CHECK(chunk_rows > 0, "lm_head_cross_entropy: chunk_rows = ", chunk_rows);
  for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
    const int64_t rows = N - r0 < chunk_rows ? N - r0 : chunk_rows;
    const T* hc = h + r0 * C;
    gemm.out(false, true, rows, Vp, C, 1.0f, hc, C, W, C, 0.0f, logits_chunk, Vp, stream);
    cross_entropy(logits_chunk, losses + r0, logits_chunk, targets + r0, rows, V, Vp, grad_scale, stream);
    gemm.out(false, false, rows, C, Vp, 1.0f, logits_chunk, Vp, W, C, 0.0f, dh + r0 * C, C, stream);
    const float beta = add_to_dW || r0 > 0 ? 1.0f : 0.0f;  // later chunks add to the first's
    if (dW) gemm.acc(true, false, Vp, C, rows, 1.0f, logits_chunk, Vp, hc, C, beta, dW, C, stream);
  }
}

template void cross_entropy<float>(float*, float*, const float*, const int32_t*, int64_t, int64_t, int64_t, float,
                                   cudaStream_t);
template void cross_entropy<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*, const int32_t*, int64_t,
                                           int64_t, int64_t, float, cudaStream_t);
template void lm_head_cross_entropy<float>(float*, float*, float*, const float*, const float*, const int32_t*, int64_t,
                                           int64_t, int64_t, int64_t, float, float*, int64_t, const LmHeadGemms<float>&,
                                           cudaStream_t, bool);
template void lm_head_cross_entropy<__nv_bfloat16>(float*, __nv_bfloat16*, float*, const __nv_bfloat16*,
                                                   const __nv_bfloat16*, const int32_t*, int64_t, int64_t, int64_t,
                                                   int64_t, float, __nv_bfloat16*, int64_t,
                                                   const LmHeadGemms<__nv_bfloat16>&, cudaStream_t, bool);

}  // namespace jtok::cuda
