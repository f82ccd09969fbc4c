// Times attention_forward / attention_backward alone (not built by CMake; run by hand):
//   g++ -O3 -march=native -std=c++20 -fopenmp -Isrc bench/attention_op.cpp build/libjtok_lib.a -ldnnl \
//       -o build/attention_op
//   OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 build/attention_op B T H KV hd [reps]
// Prints the minimum over reps (after one warm-up) of process CPU seconds and of wall seconds: on a
// shared machine CPU seconds are the steadier figure.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

#include "ops/attention.h"

static double cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
static double wall_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s B T H KV hd [reps]\n", argv[0]);
    return 2;
  }
  const int64_t B = std::atol(argv[1]), T = std::atol(argv[2]), H = std::atol(argv[3]), KV = std::atol(argv[4]),
                hd = std::atol(argv[5]);
  const int reps = argc > 6 ? std::atoi(argv[6]) : 5;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  auto randn = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& e : x) e = nd(rng);
    return x;
  };
  auto q = randn(B * T * H * hd), k = randn(B * T * KV * hd), v = randn(B * T * KV * hd), dy = randn(B * T * H * hd);
  std::vector<float> y(q.size()), P(static_cast<size_t>(B * H * T * T)), dq(q.size()), dk(k.size()), dv(v.size());
  double fc = 1e30, fw = 1e30, bc = 1e30, bw = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const double c0 = cpu_s(), w0 = wall_s();
    jtok::attention_forward(y.data(), P.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
    const double c1 = cpu_s(), w1 = wall_s();
    jtok::attention_backward(dq.data(), dk.data(), dv.data(), dy.data(), P.data(), q.data(), k.data(), v.data(), B, T,
                             H, KV, hd);
    const double c2 = cpu_s(), w2 = wall_s();
    if (r == 0) continue;  // warm-up: page faults on P, oneDNN's first-call setup
    fc = std::min(fc, c1 - c0), fw = std::min(fw, w1 - w0), bc = std::min(bc, c2 - c1), bw = std::min(bw, w2 - w1);
  }
  std::printf("B=%ld T=%ld H=%ld KV=%ld hd=%ld reps=%d  fwd cpu %.4f s wall %.4f s | bwd cpu %.4f s wall %.4f s\n",
              static_cast<long>(B), static_cast<long>(T), static_cast<long>(H), static_cast<long>(KV),
              static_cast<long>(hd), reps, fc, fw, bc, bw);
}
