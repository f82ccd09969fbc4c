// `jtok bench-peak`: this machine's fp32 FMA peak and oneDNN sgemm GFLOP/s on a transformer-shaped
// product (4096 x 768 @ 768 x 3072), for MFU denominators.
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
  nlohmann::json j = {{"threads", omp_get_max_threads()}, {"fma_peak_gflops", peak}, {"sgemm_gflops", best},
                      {"sgemm_fraction_of_peak", best / peak}, {"isa", jtok::simd_isa()}};
  std::printf("%s\n", j.dump().c_str());
}

void setup(CLI::App* sub) { sub->callback(run); }

const bool registered = jtok::register_command({"bench-peak", "measure the fp32 FMA peak and sgemm GFLOP/s", setup});

}  // namespace
