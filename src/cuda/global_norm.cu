// Global norm and clip coefficient (src/cuda/global_norm.h). Pass 1: a block a 4096-element chunk,
// fp32 block sum (or a warp a listed table row, grid-stride, fp32 warp sum). Pass 2: one block of
// 1024 threads, each a strided double sum, then a double block sum. Fixed trees throughout: the same
// bits every run.
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/global_norm.h"
#include "cuda/pdl.cuh"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kSumThreads = 1024;
constexpr int64_t kMaxRowBlocks = 2048;

template <typename G>
__global__ void __launch_bounds__(kThreads) grad_norm_sumsq_kernel(float* partials, const G* g, int64_t n) {
  pdl_wait();
  __shared__ float red[32];
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * kNormChunk;
  const int64_t hi = min(n, lo + kNormChunk);
  float s = 0.0f;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float x = to_f32(g[i]);
    s += x * x;
  }
  s = block_sum(s, red);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// A warp a listed row: row rows[i] of g for i < *count, warps grid-striding kWarps rows a block at a
// time. Each lane sums its stride-32 elements, then the warp's xor tree (warp_sum): no block barrier
// between rows (a JTok-M step lists ~10^5 rows of 768, a few elements a thread).
constexpr int kWarps = kThreads / 32;
__global__ void __launch_bounds__(kThreads)
    grad_norm_sumsq_rows_kernel(float* partials, const float* g, const int32_t* rows, const int32_t* count, int64_t d) {
  pdl_wait();
  const int64_t total = *count;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); i < total; i += stride) {
    const float* row = g + static_cast<int64_t>(rows[i]) * d;
    float s = 0.0f;
    for (int64_t j = lane; j < d; j += 32) s += row[j] * row[j];
    s = warp_sum(s);  // the loop's bounds are the warp's own: all 32 lanes take part
    if (lane == 0) partials[i] = s;
  }
}

__global__ void __launch_bounds__(kSumThreads)
    grad_norm_sum_kernel(double* sumsq, const float* partials, int64_t count, const int32_t* more) {
  pdl_wait();
  __shared__ double red[32];
  const int64_t total = count + (more ? *more : 0);
  double s = 0.0;
#pragma unroll 16
  for (int64_t i = threadIdx.x; i < total; i += blockDim.x) s += static_cast<double>(partials[i]);  // 16 in flight
  s = block_sum(s, red);
  if (threadIdx.x == 0) *sumsq = s;
}

__global__ void __launch_bounds__(1)
    grad_norm_clip_kernel(float* coef, double* norm, const double* sumsq, float max_norm) {
  pdl_wait();
  const double nv = sqrt(*sumsq);
  *norm = nv;
  float c = 1.0f;
  if (max_norm > 0) {
    const float k = max_norm / (static_cast<float>(nv) + 1e-6f);
    if (k < 1.0f) c = k;
  }
  *coef = c;
}

}  // namespace

template <typename G>
void sumsq_partials(float* partials, const G* g, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  grad_norm_sumsq_kernel<G><<<static_cast<int>(sumsq_chunks(n)), kThreads, 0, stream>>>(partials, g, n);
  JTOK_CUDA_CHECK_LAUNCH();
}

void sumsq_rows_partials(float* partials, const float* g, const int32_t* rows, const int32_t* count, int64_t n,
                         int64_t d, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t need = (n + kWarps - 1) / kWarps;
  const int blocks = static_cast<int>(need < kMaxRowBlocks ? need : kMaxRowBlocks);
  grad_norm_sumsq_rows_kernel<<<blocks, kThreads, 0, stream>>>(partials, g, rows, count, d);
  JTOK_CUDA_CHECK_LAUNCH();
}

void sum_partials(double* sumsq, const float* partials, int64_t count, cudaStream_t stream, const int32_t* more) {
  grad_norm_sum_kernel<<<1, kSumThreads, 0, stream>>>(sumsq, partials, count, more);
  JTOK_CUDA_CHECK_LAUNCH();
}

void clip_coef(float* coef, double* norm, const double* sumsq, float max_norm, cudaStream_t stream) {
  grad_norm_clip_kernel<<<1, 1, 0, stream>>>(coef, norm, sumsq, max_norm);
  JTOK_CUDA_CHECK_LAUNCH();
}

template void sumsq_partials<float>(float*, const float*, int64_t, cudaStream_t);
template void sumsq_partials<__nv_bfloat16>(float*, const __nv_bfloat16*, int64_t, cudaStream_t);

}  // namespace jtok::cuda
