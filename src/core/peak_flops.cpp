#include "core/peak_flops.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace jtok {

namespace {
// 10 independent accumulators hide the FMA latency (4 cycles x 2 pipes + slack).
double fma_loop_flops(long iters) {
#if defined(__AVX512F__)
  using V = __m512;
  constexpr int W = 16;
  auto set = [](float x) { return _mm512_set1_ps(x); };
  auto fma = [](V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); };
  auto add = [](V a, V b) { return _mm512_add_ps(a, b); };
  auto store = [](float* t, V a) { _mm512_storeu_ps(t, a); };
#else
  using V = __m256;
  constexpr int W = 8;
  auto set = [](float x) { return _mm256_set1_ps(x); };
  auto fma = [](V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); };
  auto add = [](V a, V b) { return _mm256_add_ps(a, b); };
  auto store = [](float* t, V a) { _mm256_storeu_ps(t, a); };
#endif
  V acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = set(0.001f * static_cast<float>(i));
  const V a = set(0.999999f), b = set(1e-7f);
  for (long it = 0; it < iters; ++it)
    for (int i = 0; i < 10; ++i) acc[i] = fma(acc[i], a, b);
  V s = acc[0];
  for (int i = 1; i < 10; ++i) s = add(s, acc[i]);
  float lanes[W];  // every lane summed, so none of the loop is dead code
  store(lanes, s);
  float total = 0.0f;
  for (float x : lanes) total += x;
  volatile float sink = total;
  (void)sink;
  return 2.0 * W * 10 * static_cast<double>(iters);
}
}  // namespace

double measure_peak_gflops(double seconds) {
  // One core's peak, best of several short trials (a trial that lost its core to another
  // process reads low; the best one is the core's), times the number of OpenMP threads, one per
  // core. Measuring all threads at once would read low whenever the machine is shared.
  const int trials = 5;
  const long iters = static_cast<long>(seconds / trials * 1e11 / (2.0 * 16 * 10));
  double best = 0;
  for (int t = 0; t < trials; ++t) {
    auto t0 = std::chrono::steady_clock::now();
    double flops = fma_loop_flops(iters);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops / s / 1e9);
  }
  return best * omp_get_max_threads();
}

TriadRate measure_triad() {
  const int64_t n = int64_t{1} << 25;
  std::vector<float> a(n), b(n), c(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {  // first touch by the threads that stream them below
    a[i] = 0.0f;
    b[i] = 1.0f;
    c[i] = 2.0f;
  }
  TriadRate r;
  for (int k = 0; k < 5; ++k) {
    const float sc = 0.5f + static_cast<float>(k);
    auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + sc * c[i];
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.gbs = std::max(r.gbs, 3.0 * 4.0 * static_cast<double>(n) / s / 1e9);
  }
  r.checked = a[n / 2] == 1.0f + 4.5f * 2.0f;
  return r;
}

const char* simd_isa() {
#if defined(__AVX512F__)
  return "avx512";
#else
  return "avx2";
#endif
}

}  // namespace jtok
