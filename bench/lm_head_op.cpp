// Times the LM head and its loss alone (not built by CMake; run by hand):
//   g++ -O3 -march=native -std=c++20 -fopenmp -Isrc bench/lm_head_op.cpp build/libjtok_lib.a -ldnnl \
//       -o build/lm_head_op
//   OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 build/lm_head_op N d V [reps]
// Pieces: the logits GEMM (N,Vp) = x (N,d) W^T; cross_entropy (loss and dlogits in place); the two
// backward GEMMs dx = dlogits W and dW += dlogits^T x, and other layouts of them. Prints the minimum over reps (after one
// warm-up) of wall seconds and GFLOP/s of each.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "ops/cross_entropy.h"
#include "ops/linear.h"

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int main(int argc, char** argv) {
  if (argc < 4) { std::fprintf(stderr, "usage: %s N d V [reps]\n", argv[0]); return 2; }
  const int64_t N = std::atoll(argv[1]), d = std::atoll(argv[2]), V = std::atoll(argv[3]);
  const int reps = argc > 4 ? std::atoi(argv[4]) : 5;
  const int64_t Vp = (V + 63) / 64 * 64;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(N * d), W(Vp * d), logits(N * Vp), dx(N * d), dW(Vp * d);
  std::vector<int32_t> y(N);
  for (auto& v : x) v = nd(rng);
  for (auto& v : W) v = 0.05f * nd(rng);
  for (auto& v : y) v = static_cast<int32_t>(rng() % V);
  auto time = [&](const char* name, double gflop, const std::function<void()>& f) {
    double best = 1e30;
    for (int r = 0; r <= reps; ++r) {
      double t0 = now();
      f();
      double dt = now() - t0;
      if (r > 0) best = std::min(best, dt);
    }
    std::printf("%-28s %8.4f s  %7.1f GFLOP/s\n", name, best, gflop > 0 ? gflop / best : 0.0);
  };
  const double g = 2.0 * N * d * Vp / 1e9;
  time("logits = x W^T", g, [&] { jtok::linear_forward(logits.data(), x.data(), W.data(), N, d, Vp); });
  std::vector<float> keep = logits;
  time("cross_entropy (in place)", 0, [&] {
    logits = keep;  // not timed separately: a copy of N x Vp
  });
  time("copy + cross_entropy", 0, [&] {
    logits = keep;
    jtok::cross_entropy(logits.data(), logits.data(), y.data(), N, V, Vp, 1.0f / N);
  });
  time("dx = dlogits W", g, [&] { jtok::gemm(false, false, N, d, Vp, 1.0f, logits.data(), Vp, W.data(), d, 1.0f, dx.data(), d); });
  time("dW += dlogits^T x", g, [&] { jtok::gemm(true, false, Vp, d, N, 1.0f, logits.data(), Vp, x.data(), d, 1.0f, dW.data(), d); });
  std::vector<float> dWt(d * Vp);
  time("dW^T += x^T dlogits", g, [&] { jtok::gemm(true, false, d, Vp, N, 1.0f, x.data(), d, logits.data(), Vp, 1.0f, dWt.data(), Vp); });
  std::vector<float> dxt(d * N);
  time("dx^T += W^T dlogits^T", g, [&] { jtok::gemm(true, true, d, N, Vp, 1.0f, W.data(), d, logits.data(), Vp, 1.0f, dxt.data(), N); });
  time("dx in 8 vocab chunks", g, [&] {
    const int64_t C = Vp / 8;
    for (int64_t c = 0; c < 8; ++c)
      jtok::gemm(false, false, N, d, C, 1.0f, logits.data() + c * C, Vp, W.data() + c * C * d, d, 1.0f, dx.data(), d);
  });
  time("dx in 8 row chunks", g, [&] {
    const int64_t R = N / 8;
    for (int64_t c = 0; c < 8; ++c)
      jtok::gemm(false, false, R, d, Vp, 1.0f, logits.data() + c * R * Vp, Vp, W.data(), d, 1.0f, dx.data() + c * R * d, d);
  });
  return 0;
}
