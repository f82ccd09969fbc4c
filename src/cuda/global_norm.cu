// Global norm and clip coefficient (src/cuda/global_norm.h). Pass 1: a block a 4096-element chunk,
// fp32 block sum. Pass 2: one block of 1024 threads, each a strided double sum, then a double block
// sum. Fixed trees throughout: the same bits every run.
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/global_norm.h"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kSumThreads = 1024;

template <typename G>
__global__ void sumsq_partials_kernel(float* partials, const G* g, int64_t n) {
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

__global__ void sum_partials_kernel(double* sumsq, const float* partials, int64_t count) {
  __shared__ double red[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += static_cast<double>(partials[i]);
  s = block_sum(s, red);
  if (threadIdx.x == 0) *sumsq = s;
}

__global__ void clip_coef_kernel(float* coef, double* norm, const double* sumsq, float max_norm) {
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
  sumsq_partials_kernel<G><<<static_cast<int>(sumsq_chunks(n)), kThreads, 0, stream>>>(partials, g, n);
  JTOK_CUDA_CHECK_LAUNCH();
}

void sum_partials(double* sumsq, const float* partials, int64_t count, cudaStream_t stream) {
  sum_partials_kernel<<<1, kSumThreads, 0, stream>>>(sumsq, partials, count);
  JTOK_CUDA_CHECK_LAUNCH();
}

void clip_coef(float* coef, double* norm, const double* sumsq, float max_norm, cudaStream_t stream) {
  clip_coef_kernel<<<1, 1, 0, stream>>>(coef, norm, sumsq, max_norm);
  JTOK_CUDA_CHECK_LAUNCH();
}

template void sumsq_partials<float>(float*, const float*, int64_t, cudaStream_t);
template void sumsq_partials<__nv_bfloat16>(float*, const __nv_bfloat16*, int64_t, cudaStream_t);

}  // namespace jtok::cuda
