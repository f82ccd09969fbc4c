#include "ops/gemm_rate.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "ops/linear.h"

namespace jtok {

double measure_sgemm_gflops() {
  const int64_t M = 4096, N = 3072, K = 768;
  std::vector<float> A(M * K, 0.01f), B(N * K, 0.02f), C(M * N);
  gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);  // warm-up
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    auto g0 = std::chrono::steady_clock::now();
    gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count();
    best = std::max(best, 2.0 * M * N * K / s / 1e9);
  }
  return best;
}

}  // namespace jtok
