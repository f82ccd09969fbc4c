// Telemetry reductions (cuda/stats.h).
#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/pdl.cuh"
#include "cuda/stats.h"
#include "cuda/vec.cuh"

namespace jtok::cuda {

namespace {

constexpr int kBlocks = 256, kThreads = 256;  // at most kBlocks blocks an array: fewer where it is short
constexpr int kMaxArrays = 64;  // a launch's arrays, passed by value (512 bytes of parameters)

template <typename T>
struct Arrays {
  const T* x[kMaxArrays];
};

// Block (b, l) of gridDim.x blocks an array: partial[2 (l kBlocks + b)] and the next = sum x, sum x^2
// of array l over its elements (Vec: vectors of kVec<T>) i = b kThreads + t + k gridDim.x kThreads,
// each thread's in k's order, then the block's fixed tree.
template <typename T, bool Vec>
__device__ __forceinline__ void partial_sums(double* partial, const T* x, int64_t n) {
  __shared__ double red[32];
  double s = 0.0, ss = 0.0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  if constexpr (Vec) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n / kVec<T>; i += stride) {
      float v[kVec<T>];
      load_vec(v, x + i * kVec<T>);
#pragma unroll
      for (int e = 0; e < kVec<T>; ++e) s += static_cast<double>(v[e]), ss += static_cast<double>(v[e]) * v[e];
    }
  } else {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
      const double v = to_f32(x[i]);
      s += v, ss += v * v;
    }
  }
  s = block_sum(s, red);
  ss = block_sum(ss, red);
  const int64_t at = 2 * (static_cast<int64_t>(blockIdx.y) * kBlocks + blockIdx.x);
  if (threadIdx.x == 0) partial[at] = s, partial[at + 1] = ss;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) stats_partial_sums_kernel(double* partial, Arrays<T> xs, int64_t n) {
  pdl_wait();
  partial_sums<T, false>(partial, xs.x[blockIdx.y], n);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) stats_partial_sums_vec_kernel(double* partial, Arrays<T> xs, int64_t n) {
  pdl_wait();
  partial_sums<T, true>(partial, xs.x[blockIdx.y], n);
}

// Thread l: array l's partials (blocks of them) in block order.
__global__ void __launch_bounds__(kMaxArrays)
    stats_total_kernel(double* out, const double* partial, int arrays, int blocks) {
  pdl_wait();
  const int l = static_cast<int>(threadIdx.x);
  if (l >= arrays) return;
  double s = 0.0, ss = 0.0;
  for (int b = 0; b < blocks; ++b) s += partial[2 * (l * kBlocks + b)], ss += partial[2 * (l * kBlocks + b) + 1];
  out[2 * l] = s, out[2 * l + 1] = ss;
}

}  // namespace

int64_t sums_and_squares_scratch(int64_t L) { return 2 * kBlocks * (L < kMaxArrays ? L : kMaxArrays); }

template <typename T>
void sums_and_squares(double* out, const std::vector<const T*>& xs, int64_t n, double* scratch, cudaStream_t stream) {
  for (size_t l0 = 0; l0 < xs.size(); l0 += kMaxArrays) {  // the launches share the scratch, in stream order
    const int arrays = static_cast<int>(xs.size() - l0 < kMaxArrays ? xs.size() - l0 : kMaxArrays);
    Arrays<T> a{};
    bool vec = n % kVec<T> == 0;
    for (int l = 0; l < arrays; ++l) a.x[l] = xs[l0 + l], vec = vec && vec_fits<T>({a.x[l]}, {});
    // A block for each kThreads items (elements, or vectors), at most kBlocks: a short array (a tiny
    // model's layer) launches a few blocks, not kBlocks of idle threads.
    const int64_t items = vec ? n / kVec<T> : n, blocks = std::min<int64_t>(kBlocks, (items + kThreads - 1) / kThreads);
    const dim3 grid(static_cast<unsigned>(std::max<int64_t>(blocks, 1)), static_cast<unsigned>(arrays));
    if (vec)
      stats_partial_sums_vec_kernel<T><<<grid, kThreads, 0, stream>>>(scratch, a, n);
    else
      stats_partial_sums_kernel<T><<<grid, kThreads, 0, stream>>>(scratch, a, n);
    JTOK_CUDA_CHECK_LAUNCH();
    stats_total_kernel<<<1, kMaxArrays, 0, stream>>>(out + 2 * l0, scratch, arrays, static_cast<int>(grid.x));
    JTOK_CUDA_CHECK_LAUNCH();
  }
}

template void sums_and_squares<float>(double*, const std::vector<const float*>&, int64_t, double*, cudaStream_t);
template void sums_and_squares<__nv_bfloat16>(double*, const std::vector<const __nv_bfloat16*>&, int64_t, double*,
                                              cudaStream_t);

}  // namespace jtok::cuda
