// `jtok bench-peak`: this machine's fp32 FMA peak and oneDNN sgemm GFLOP/s on a transformer-shaped
// product (4096 x 768 @ 768 x 3072), for MFU denominators; and its memory bandwidth, STREAM's
// triad a = b + s * c over three 32M-float arrays (384 MiB, far beyond the caches) with the
// OpenMP threads, best of 5, counting 3 x 4 bytes per element as STREAM does: the denominator of
// memory-bound decode (bench/serve_throughput.sh).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/peak_flops.h"
#include "ops/linear.h"

namespace {

void run() {
  const double peak = jtok::measure_peak_gflops(1.0);
  const int64_t M = 4096, N = 3072, K = 768;
  std::vector<float> A(M * K, 0.01f), B(N * K, 0.02f), C(M * N);
  jtok::gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);  // warm-up
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    auto g0 = std::chrono::steady_clock::now();
    jtok::gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count();
    best = std::max(best, 2.0 * M * N * K / s / 1e9);
  }
  const int64_t n = int64_t{1} << 25;
  std::vector<float> a(n), b(n), c(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {  // first touch by the threads that stream them below
    a[i] = 0.0f;
    b[i] = 1.0f;
    c[i] = 2.0f;
  }
  double triad = 0;
  for (int r = 0; r < 5; ++r) {
    const float sc = 0.5f + static_cast<float>(r);
    auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + sc * c[i];
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    triad = std::max(triad, 3.0 * 4.0 * static_cast<double>(n) / s / 1e9);
  }
  if (a[n / 2] != 1.0f + 4.5f * 2.0f) std::fprintf(stderr, "bench-peak: triad check failed\n");
  nlohmann::json j = {{"threads", omp_get_max_threads()}, {"fma_peak_gflops", peak}, {"sgemm_gflops", best},
                      {"sgemm_fraction_of_peak", best / peak}, {"isa", jtok::simd_isa()}, {"triad_gbs", triad}};
  std::printf("%s\n", j.dump().c_str());
}

void setup(CLI::App* sub) { sub->callback(run); }

const bool registered = jtok::register_command({"bench-peak", "measure the fp32 FMA peak, sgemm GFLOP/s and the memory bandwidth (STREAM triad)", setup});

}  // namespace
