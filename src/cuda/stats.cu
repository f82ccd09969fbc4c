// Telemetry reductions (cuda/stats.h).
#include <cuda_bf16.h>

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/pdl.cuh"
#include "cuda/stats.h"

namespace jtok::cuda {

namespace {

constexpr int kBlocks = 256, kThreads = 256;

// Block b: partial[2b], partial[2b+1] = sum x, sum x^2 over i = b*kThreads + t + k*kBlocks*kThreads.
template <typename T>
__global__ void __launch_bounds__(kThreads) stats_partial_sums_kernel(double* partial, const T* x, int64_t n) {
  pdl_wait();
  __shared__ double red[32];
  double s = 0.0, ss = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = to_f32(x[i]);
    s += v, ss += v * v;
  }
  s = block_sum(s, red);
  ss = block_sum(ss, red);
  if (threadIdx.x == 0) partial[2 * blockIdx.x] = s, partial[2 * blockIdx.x + 1] = ss;
}

// One thread: the partials in block order.
__global__ void __launch_bounds__(1) stats_total_kernel(double* out, const double* partial, int blocks) {
  pdl_wait();
  double s = 0.0, ss = 0.0;
  for (int b = 0; b < blocks; ++b) s += partial[2 * b], ss += partial[2 * b + 1];
  out[0] = s, out[1] = ss;
}

}  // namespace

int64_t sum_and_squares_scratch() { return 2 * kBlocks; }

template <typename T>
void sum_and_squares(double* out, const T* x, int64_t n, double* scratch, cudaStream_t stream) {
  stats_partial_sums_kernel<T><<<kBlocks, kThreads, 0, stream>>>(scratch, x, n);
  JTOK_CUDA_CHECK_LAUNCH();
  stats_total_kernel<<<1, 1, 0, stream>>>(out, scratch, kBlocks);
  JTOK_CUDA_CHECK_LAUNCH();
}

template void sum_and_squares<float>(double*, const float*, int64_t, double*, cudaStream_t);
template void sum_and_squares<__nv_bfloat16>(double*, const __nv_bfloat16*, int64_t, double*, cudaStream_t);

}  // namespace jtok::cuda
