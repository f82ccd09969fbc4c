// The model's small helpers (src/cuda/model_kernels.h): one thread an element, or a column of a
// range of rows.
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

constexpr int64_t kBiasBlocks = 512;  // row ranges a column is summed in: a fixed partition of the rows

// part (R, C) fp32: part[r][c] = column c of dx's rows [r P, (r + 1) P) summed from zero in row order.
template <typename E>
__global__ void __launch_bounds__(kThreads)
    bias_partials_kernel(float* part, const E* __restrict__ dx, int64_t N, int64_t C, int64_t P) {
  pdl_wait();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t lo = blockIdx.y * P, hi = min(N, lo + P);
  float s = 0.0f;
#pragma unroll 8
  for (int64_t n = lo; n < hi; ++n) s += to_f32(dx[n * C + c]);
  part[blockIdx.y * C + c] = s;
}

// db (C) += the R partials of each column, in row-range order.
__global__ void __launch_bounds__(kThreads) bias_sum_kernel(float* db, const float* part, int64_t R, int64_t C) {
  pdl_wait();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < C) db[c] += strided_sum_in_order(part + c, R, C);
}

int64_t bias_blocks(int64_t N) { return N < kBiasBlocks ? N : kBiasBlocks; }

}  // namespace

template <typename E>
void convert_from_f32(E* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  convert_kernel<E><<<ceil_div(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename E>
void bias_grad(float* db, const E* dx, int64_t N, int64_t C, float* scratch, cudaStream_t stream) {
  if (!db || C == 0 || N == 0) return;  // a frozen bias
  const int64_t R = bias_blocks(N), P = (N + R - 1) / R;
  const dim3 grid(static_cast<unsigned>(ceil_div(C, kThreads)), static_cast<unsigned>(R));
  bias_partials_kernel<E><<<grid, kThreads, 0, stream>>>(scratch, dx, N, C, P);
  JTOK_CUDA_CHECK_LAUNCH();
  bias_sum_kernel<<<ceil_div(C, kThreads), kThreads, 0, stream>>>(db, scratch, R, C);
  JTOK_CUDA_CHECK_LAUNCH();
}

int64_t bias_grad_scratch(int64_t N, int64_t C) { return bias_blocks(N) * C; }

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
template void bias_grad<float>(float*, const float*, int64_t, int64_t, float*, cudaStream_t);
template void bias_grad<__nv_bfloat16>(float*, const __nv_bfloat16*, int64_t, int64_t, float*, cudaStream_t);

}  // namespace jtok::cuda
