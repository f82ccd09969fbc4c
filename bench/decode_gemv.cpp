// A decoding step's matrix products alone (batch 1 by default), at config b's shapes: 12 layers of
// q, k, v (one linear_forward_lowp_multi), o, gate and up (one multi), down, then the LM head
// (50257 x 768), every matrix distinct in memory (as in a model: ~610 MB in f32, so the weights
// stream from DRAM or L3 as they do in `jtok generate`), in f32, bf16 and int8, each by the fastest
// kernels and by the per-row ones that decoding uses (RowKernel::per_row: batch-invariant), and bf16 and
// int8 also by the many-row products alone (lowp_gemm, where the CPU has them: the crossover against
// per_row), interleaved rounds so load drifts hit all eight. Prints the median ms per step and the
// weight bytes read per second.
// Not built by CMake; run by hand:
//   g++ -O3 -march=native -std=c++20 -fopenmp -Isrc bench/decode_gemv.cpp build/libjtok_lib.a -ldnnl -o
//   build/decode_gemv OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 build/decode_gemv [N] [rounds]
// With one thread the time is the process's CPU time (robust to other jobs taking the core, not to
// their memory traffic); with more, wall time.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

#include "ops/lowp_gemm.h"
#include "ops/lowp_linear.h"

using namespace jtok;

static double now(bool cpu) {
  if (!cpu) return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

struct Mat {
  std::vector<float> f32, scale;
  std::vector<uint16_t> bf16;
  std::vector<int8_t> q;
  int64_t R, C;
  Mat(int64_t R_, int64_t C_, std::mt19937& rng) : f32(R_ * C_), scale(R_), bf16(R_ * C_), q(R_ * C_), R(R_), C(C_) {
    std::normal_distribution<float> nd(0.0f, 0.02f);
    for (auto& v : f32) v = nd(rng);
    quantize_bf16(bf16.data(), f32.data(), R * C);
    quantize_int8_rows(q.data(), scale.data(), f32.data(), R, C);
  }
  WeightMatrix view(Dtype t) const {
    if (t == Dtype::f32) return {t, f32.data(), nullptr, R, C};
    if (t == Dtype::bf16) return {t, bf16.data(), nullptr, R, C};
    return {t, q.data(), scale.data(), R, C};
  }
};

// A step's activations: x is the input of every product (gate's width, so down reads it too).
struct Bufs {
  std::vector<float> x, q, k, v, h, g, u, y;
  Bufs(int64_t N, int64_t d, int64_t F, int64_t V)
      : x(N * F, 0.1f), q(N * d), k(N * d), v(N * d), h(N * d), g(N * F), u(N * F), y(N * V) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * i);
  }
};

// One step's products by lowp_gemm alone (q, k, v one call each).
void step_lowp_gemm(const std::vector<Mat>& m, Dtype dt, Bufs& b, int64_t N, int64_t L) {
  for (int64_t l = 0; l < L; ++l) {
    const Mat* w = &m[7 * l];
    lowp_gemm(b.q.data(), b.x.data(), w[0].view(dt), N, false);
    lowp_gemm(b.k.data(), b.x.data(), w[1].view(dt), N, false);
    lowp_gemm(b.v.data(), b.x.data(), w[2].view(dt), N, false);
    lowp_gemm(b.h.data(), b.q.data(), w[3].view(dt), N, true);
    lowp_gemm(b.g.data(), b.x.data(), w[4].view(dt), N, false);
    lowp_gemm(b.u.data(), b.x.data(), w[5].view(dt), N, false);
    lowp_gemm(b.h.data(), b.g.data(), w[6].view(dt), N, true);
  }
  lowp_gemm(b.y.data(), b.x.data(), m.back().view(dt), N, false);
}

// One step's products as the decoder makes them (q | k | v and gate | up as multis).
void step_linear(const std::vector<Mat>& m, Dtype dt, RowKernel rk, Bufs& b, int64_t N, int64_t L) {
  for (int64_t l = 0; l < L; ++l) {
    const Mat* w = &m[7 * l];
    const LinearOut qkv[3] = {{b.q.data(), w[0].view(dt)}, {b.k.data(), w[1].view(dt)}, {b.v.data(), w[2].view(dt)}};
    linear_forward_lowp_multi(qkv, 3, b.x.data(), N, rk);
    linear_forward_lowp(b.h.data(), b.q.data(), w[3].view(dt), N, true, rk);
    const LinearOut gu[2] = {{b.g.data(), w[4].view(dt)}, {b.u.data(), w[5].view(dt)}};
    linear_forward_lowp_multi(gu, 2, b.x.data(), N, rk);
    linear_forward_lowp(b.h.data(), b.g.data(), w[6].view(dt), N, true, rk);
  }
  linear_forward_lowp(b.y.data(), b.x.data(), m.back().view(dt), N, false, rk);
}

int main(int argc, char** argv) {
  const int64_t N = argc > 1 ? std::atoll(argv[1]) : 1;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 9;
  const int64_t d = 768, F = 3072, V = 50257, L = 12;
  const bool cpu = omp_get_max_threads() == 1;
  std::mt19937 rng(1);
  std::vector<Mat> m;
  m.reserve(7 * L + 1);
  for (int64_t l = 0; l < L; ++l) {
    for (int i = 0; i < 4; ++i) m.emplace_back(d, d, rng);  // q k v o
    m.emplace_back(F, d, rng);                              // gate
    m.emplace_back(F, d, rng);                              // up
    m.emplace_back(d, F, rng);                              // down
  }
  m.emplace_back(V, d, rng);
  double params = 0;
  for (auto& x : m) params += static_cast<double>(x.R) * x.C;
  Bufs b(N, d, F, V);
  const Dtype dts[3] = {Dtype::f32, Dtype::bf16, Dtype::int8};
  const RowKernel rks[2] = {RowKernel::fastest, RowKernel::per_row};
  constexpr int K = 8;  // f32, bf16, int8 fastest; the same per_row; bf16, int8 by lowp_gemm
  std::vector<double> t[K];
  for (int r = 0; r <= rounds; ++r)
    for (int k6 = 0; k6 < K; ++k6) {
      const Dtype dt = k6 < 6 ? dts[k6 % 3] : dts[k6 - 5];
      if (k6 >= 6 && !lowp_gemm_enabled(dt)) continue;
      const double t0 = now(cpu);
      if (k6 >= 6)
        step_lowp_gemm(m, dt, b, N, L);
      else
        step_linear(m, dt, rks[(k6 / 3) % 2], b, N, L);
      if (r > 0) t[k6].push_back(now(cpu) - t0);  // round 0 warms up
    }
  std::printf("decode_gemv: N %ld, %d threads (%s time), %.1f M weights per step\n", static_cast<long>(N),
              omp_get_max_threads(), cpu ? "CPU" : "wall", params / 1e6);
  for (int k6 = 0; k6 < K; ++k6) {
    if (t[k6].empty()) continue;
    std::sort(t[k6].begin(), t[k6].end());
    const double med = t[k6][t[k6].size() / 2];
    const Dtype dt = k6 < 6 ? dts[k6 % 3] : dts[k6 - 5];
    std::printf("  %-5s %-9s %8.2f ms/step (min %.2f)  %6.1f GB/s of weights\n", dtype_name(dt),
                k6 < 3   ? "fastest"
                : k6 < 6 ? "per_row"
                         : "lowp_gemm",
                med * 1e3, t[k6][0] * 1e3, params * dtype_bytes(dt) / med / 1e9);
  }
}
