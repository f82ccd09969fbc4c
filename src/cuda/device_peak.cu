// What device 0 reaches (src/cuda/device_peak.h): checked bf16 products, device and pinned copies.
//   fill: p (n) bf16 = ((i mod 13) - 6) / 8
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/device_array.h"
#include "cuda/device_peak.h"
#include "cuda/matmul.h"
#include "cuda/pdl.cuh"
#include "cuda/phase_profile.h"

namespace jtok::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;

__host__ __device__ inline float operand_value(int64_t i) { return static_cast<float>(i % 13 - 6) * 0.125f; }

__global__ void __launch_bounds__(kThreads) peak_fill_kernel(bf16* p, int64_t n) {
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(operand_value(i));
}

void fill_operand(bf16* p, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
  peak_fill_kernel<<<blocks, kThreads, 0, s>>>(p, n);
  JTOK_CUDA_CHECK_LAUNCH();
}

// The stream of the measurements, released however they end.
struct Timer {
  cudaStream_t stream = nullptr;
  Timer() { JTOK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~Timer() { cudaStreamDestroy(stream); }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  // The best milliseconds of reps calls of f (queued on stream), after one warm-up call.
  double best_ms(const std::function<void()>& f, int reps) { return best_event_ms(stream, f, reps); }
};

PeakProduct measure_product(Matmul& mm, Timer& t, const std::array<int64_t, 3>& shape, int reps) {
  PeakProduct p{shape[0], shape[1], shape[2]};
  if (p.M <= 0 || p.N <= 0 || p.K <= 0 || p.K >= (int64_t{1} << 18))
    fail("bench-peak: the product (", p.M, ", ", p.N, ", ", p.K,
         ") needs positive sizes and K below 2^18 (its check's sums are exact only so)");
  DeviceArray<bf16> x(p.M * p.K), w(p.N * p.K), c(p.M * p.N);
  fill_operand(x.get(), x.size(), t.stream);
  fill_operand(w.get(), w.size(), t.stream);
  p.ms = t.best_ms(
      [&] {
        mm.gemm<bf16, bf16>(false, true, p.M, p.N, p.K, 1.0f, x.get(), p.K, w.get(), p.K, 0.0f, c.get(), p.N, nullptr,
                            t.stream);
      },
      reps);
  p.tflops = 2.0 * static_cast<double>(p.M) * static_cast<double>(p.N) * static_cast<double>(p.K) / (p.ms * 1e9);
  JTOK_CUDA_CHECK(cudaStreamSynchronize(t.stream));  // the check's copies run on the legacy stream
  p.max_rel_error = sampled_product_error(c.get(), p.M, p.N, p.K);
  if (!(p.max_rel_error <= 1.0 / 128))
    fail("bench-peak: the bf16 product (", p.M, ", ", p.N, ", ", p.K, ") is wrong: a sampled entry is off by ",
         p.max_rel_error, " of the host's sum (bf16's rounding is at most 2^-8)");
  return p;
}

// Device -> device, pinned host -> device and back, copy_bytes each.
void measure_copies(DevicePeaks& out, Timer& t, int64_t bytes, int reps) {
  out.copy_bytes = bytes;
  if (bytes <= 0) return;
  DeviceArray<uint8_t> a(bytes), b(bytes);
  PinnedArray<uint8_t> host(bytes);
  a.zero(t.stream);
  std::fill_n(host.get(), bytes, uint8_t{1});
  const auto n = static_cast<size_t>(bytes);
  const double gb = static_cast<double>(bytes) / 1e9;
  const double d2d = t.best_ms(
      [&] { JTOK_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), n, cudaMemcpyDeviceToDevice, t.stream)); }, reps);
  const double h2d = t.best_ms(
      [&] { JTOK_CUDA_CHECK(cudaMemcpyAsync(a.get(), host.get(), n, cudaMemcpyHostToDevice, t.stream)); }, reps);
  const double d2h = t.best_ms(
      [&] { JTOK_CUDA_CHECK(cudaMemcpyAsync(host.get(), b.get(), n, cudaMemcpyDeviceToHost, t.stream)); }, reps);
  out.device_copy_gbs = 2 * gb / (d2d * 1e-3);
  out.h2d_gbs = gb / (h2d * 1e-3);
  out.d2h_gbs = gb / (d2h * 1e-3);
}

}  // namespace

double sampled_product_error(const void* c, int64_t M, int64_t N, int64_t K) {
  double worst = 0;
  for (int64_t s = 0; s < 16; ++s) {
    const int64_t m = (s * 7919) % M, n = (s * 104729 + 3) % N;
    double sum = 0;
    for (int64_t k = 0; k < K; ++k)
      sum += static_cast<double>(operand_value(m * K + k)) * static_cast<double>(operand_value(n * K + k));
    bf16 got;
    JTOK_CUDA_CHECK(cudaMemcpy(&got, static_cast<const bf16*>(c) + m * N + n, sizeof got, cudaMemcpyDeviceToHost));
    const double err = std::fabs(static_cast<double>(__bfloat162float(got)) - sum) / std::max(std::fabs(sum), 1.0);
    worst = std::max(worst, std::isfinite(err) ? err : INFINITY);
  }
  return worst;
}

DevicePeaks measure_device_peaks(const std::vector<std::array<int64_t, 3>>& products, int64_t copy_bytes, int reps) {
  if (reps < 1) fail("bench-peak: --reps ", reps, " must be at least 1");
  DevicePeaks out;
  Timer t;
  Matmul mm;
  for (const auto& shape : products) out.products.push_back(measure_product(mm, t, shape, reps));
  measure_copies(out, t, copy_bytes, reps);
  return out;
}

}  // namespace jtok::cuda
