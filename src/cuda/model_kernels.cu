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

constexpr int64_t kSpanChunk = 16 * kThreads;  // elements a block zeroes, of the spans laid end to end

// Block b: elements [b kSpanChunk, (b + 1) kSpanChunk) of the S spans laid end to end (span s their
// [sums[s], sums[s + 1]), at base + starts[s]); each thread finds its first span by bisection, then
// walks forward with its elements.
__global__ void __launch_bounds__(kThreads)
    zero_spans_kernel(float* base, const int64_t* __restrict__ starts, const int64_t* __restrict__ sums, int64_t S) {
  pdl_wait();
  const int64_t total = sums[S], first = static_cast<int64_t>(blockIdx.x) * kSpanChunk + threadIdx.x;
  const int64_t end = min(total, first - threadIdx.x + kSpanChunk);
  if (first >= end) return;
  int64_t lo = 0, hi = S - 1;  // the last span beginning at or before `first`
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (sums[mid] <= first)
      lo = mid;
    else
      hi = mid - 1;
  }
  for (int64_t i = first, s = lo; i < end; i += blockDim.x) {
    while (i >= sums[s + 1]) ++s;
    base[starts[s] + (i - sums[s])] = 0.0f;
  }
}

}  // namespace

DeviceSpans upload_spans(const std::vector<Span>& spans) {
  DeviceSpans d;
  d.S = static_cast<int64_t>(spans.size());
  std::vector<int64_t> host(2 * spans.size() + 1, 0);  // starts, then the running sums from 0
  for (size_t s = 0; s < spans.size(); ++s) {
    JTOK_CHECK(spans[s].offset >= 0 && spans[s].count > 0, "upload_spans: span ", s, " at ", spans[s].offset, " of ",
               spans[s].count);
    host[s] = spans[s].offset;
    host[spans.size() + s + 1] = host[spans.size() + s] + spans[s].count;
  }
  d.total = host.back();
  d.at.resize(static_cast<int64_t>(host.size()));
  copy_to_device(d.at.get(), host.data(), static_cast<int64_t>(host.size()));
  return d;
}

void zero_spans(float* base, const DeviceSpans& spans, cudaStream_t stream) {
  if (spans.S == 0 || spans.total == 0) return;
  zero_spans_kernel<<<ceil_div(spans.total, kSpanChunk), kThreads, 0, stream>>>(base, spans.at.get(),
                                                                                spans.at.get() + spans.S, spans.S);
  JTOK_CUDA_CHECK_LAUNCH();
}

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
