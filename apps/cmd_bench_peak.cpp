// `jtok bench-peak`: measures this machine's fp32 FMA peak (GFLOP/s) with a register-only loop on
// every OpenMP thread, and oneDNN sgemm on a transformer-shaped product, for MFU denominators.
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "ops/linear.h"

namespace {

// 10 independent accumulators hide the FMA latency (4 cycles x 2 pipes + slack).
double fma_loop_flops(long iters) {
#if defined(__AVX512F__)
  using V = __m512;
  constexpr int W = 16;
  auto set = [](float x) { return _mm512_set1_ps(x); };
  auto fma = [](V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); };
  auto add = [](V a, V b) { return _mm512_add_ps(a, b); };
  auto sum0 = [](V a) { return _mm512_reduce_add_ps(a); };
#else
  using V = __m256;
  constexpr int W = 8;
  auto set = [](float x) { return _mm256_set1_ps(x); };
  auto fma = [](V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); };
  auto add = [](V a, V b) { return _mm256_add_ps(a, b); };
  auto sum0 = [](V a) { float t[8]; _mm256_storeu_ps(t, a); return t[0]; };
#endif
  V acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = set(0.001f * i);
  const V a = set(0.999999f), b = set(1e-7f);
  for (long it = 0; it < iters; ++it)
    for (int i = 0; i < 10; ++i) acc[i] = fma(acc[i], a, b);
  V s = acc[0];
  for (int i = 1; i < 10; ++i) s = add(s, acc[i]);
  volatile float sink = sum0(s);
  (void)sink;
  return 2.0 * W * 10 * static_cast<double>(iters);
}

void run() {
  const long iters = 200'000'000 / 10;
  double total = 0;
  auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : total)
  total += fma_loop_flops(iters);
  double fma_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
  nlohmann::json j = {{"threads", omp_get_max_threads()},
                      {"fma_peak_gflops", total / fma_s / 1e9},
                      {"sgemm_gflops", best},
#if defined(__AVX512F__)
                      {"isa", "avx512"}
#else
                      {"isa", "avx2"}
#endif
  };
  std::printf("%s\n", j.dump().c_str());
}

void setup(CLI::App* sub) { sub->callback(run); }

const bool registered = jtok::register_command({"bench-peak", "measure the fp32 FMA peak and sgemm GFLOP/s", setup});

}  // namespace
