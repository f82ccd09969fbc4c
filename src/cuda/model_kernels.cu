// The model's small helpers (src/cuda/model_kernels.h): one thread an element, or a column.
#include <cuda_bf16.h>

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/device_array.h"
#include "cuda/global_norm.h"
#include "cuda/model_kernels.h"
#include "cuda/pdl.cuh"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;

template <typename E>
__global__ void __launch_bounds__(kThreads) convert_kernel(E* out, const float* in, int64_t n) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = from_f32<E>(in[i]);
}

template <typename E>
__global__ void __launch_bounds__(kThreads) bias_grad_kernel(float* db, const E* dx, int64_t N, int64_t C) {
  pdl_wait();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int64_t n = 0; n < N; ++n) s += to_f32(dx[n * C + c]);
  db[c] += s;
}

}  // namespace

template <typename E>
void convert_from_f32(E* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  convert_kernel<E><<<ceil_div(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename E>
void bias_grad(float* db, const E* dx, int64_t N, int64_t C, cudaStream_t stream) {
  if (!db || C == 0) return;  // a frozen bias
  bias_grad_kernel<E><<<ceil_div(C, kThreads), kThreads, 0, stream>>>(db, dx, N, C);
  JTOK_CUDA_CHECK_LAUNCH();
}

void check_ids(const int32_t* ids, int64_t N, int64_t V, const char* what) {
  for (int64_t n = 0; n < N; ++n)
    if (ids[n] < 0 || ids[n] >= V)
      fail(what, " id ", ids[n], " at position ", n, " outside the vocabulary [0, ", V, ")");
}

double device_mean(const float* x, double* sum, HostReadback& rb, int64_t N, cudaStream_t stream) {
  sum_partials(sum, x, N, stream);
  return *rb.read(sum, 1, stream) / static_cast<double>(N);
}

template void convert_from_f32<float>(float*, const float*, int64_t, cudaStream_t);
template void convert_from_f32<__nv_bfloat16>(__nv_bfloat16*, const float*, int64_t, cudaStream_t);
template void bias_grad<float>(float*, const float*, int64_t, int64_t, cudaStream_t);
template void bias_grad<__nv_bfloat16>(float*, const __nv_bfloat16*, int64_t, int64_t, cudaStream_t);

}  // namespace jtok::cuda
