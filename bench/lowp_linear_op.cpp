// Times linear_forward_lowp for f32 (sgemm), bf16 and int8 weights at config b's shapes (not built
// by CMake; run by hand):
//   g++ -O3 -march=native -std=c++20 -fopenmp -Isrc bench/lowp_linear_op.cpp build/libjtok_lib.a -ldnnl \
//       -o build/lowp_linear_op
//   OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 build/lowp_linear_op [N,N,..] [reps] [K,K,..]
// For each (N, shape): the median over reps of interleaved rounds (f32, bf16, int8 one after the
// other, so load drifts hit all three) of wall ms, and the weight bytes each read per call in GB/s.
// K,K,..: int8 once per listed kernel set (vnni, avx2, fallback: ops/q8_gemm.h), e.g. avx2,fallback.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ops/lowp_linear.h"
#include "ops/q8_gemm.h"

using namespace jtok;
// Process CPU seconds: with one thread, robust to other jobs taking the core (not to their cache traffic).
static double now() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char** argv) {
  std::vector<int64_t> Ns = {1, 16, 512};
  if (argc > 1) {
    Ns.clear();
    std::stringstream ss(argv[1]);
    for (std::string t; std::getline(ss, t, ',');) Ns.push_back(std::atoll(t.c_str()));
  }
  const int reps = argc > 2 ? std::atoi(argv[2]) : 15;
  std::vector<Q8Kernels> ks = {q8_kernels()};
  if (argc > 3) {
    ks.clear();
    std::stringstream ss(argv[3]);
    for (std::string t; std::getline(ss, t, ',');) ks.push_back(parse_q8_kernels(t.c_str(), "kernel set"));
  }
  const int K = 2 + static_cast<int>(ks.size());  // f32, bf16, then int8 under each kernel set
  const int64_t shapes[][2] = {{768, 768}, {3072, 768}, {768, 3072}, {50257, 768}};  // (OC, C)
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::printf("%6s %14s %10s %10s", "N", "OC x C", "f32 ms", "bf16 ms");
  for (Q8Kernels k : ks) std::printf(" %14s", (std::string("int8 ") + q8_kernels_name(k) + " ms").c_str());
  std::printf(" %9s %9s %9s\n", "f32 GB/s", "bf16 GB/s", "int8 GB/s");
  for (int64_t N : Ns)
    for (auto& sh : shapes) {
      const int64_t OC = sh[0], C = sh[1];
      std::vector<float> W(OC * C), x(N * C), y(N * OC), scale(OC);
      for (auto& v : W) v = nd(rng);
      for (auto& v : x) v = nd(rng);
      std::vector<uint16_t> b(OC * C);
      std::vector<int8_t> q(OC * C);
      quantize_bf16(b.data(), W.data(), OC * C);
      quantize_int8_rows(q.data(), scale.data(), W.data(), OC, C);
      const WeightMatrix ws[3] = {{Dtype::f32, W.data(), nullptr, OC, C},
                                  {Dtype::bf16, b.data(), nullptr, OC, C},
                                  {Dtype::int8, q.data(), scale.data(), OC, C}};
      std::vector<std::vector<double>> t(K);
      for (int r = 0; r <= reps; ++r)
        for (int k = 0; k < K; ++k) {
          if (k >= 2) set_q8_kernels(ks[k - 2]);
          const double t0 = now();
          linear_forward_lowp(y.data(), x.data(), ws[std::min(k, 2)], N);
          if (r > 0) t[k].push_back(now() - t0);  // round 0 warms up
        }
      std::vector<double> med(K);
      for (int k = 0; k < K; ++k) {
        std::sort(t[k].begin(), t[k].end());
        med[k] = t[k][t[k].size() / 2];
      }
      std::printf("%6ld %7ld x %4ld %10.3f %10.3f", N, OC, C, med[0] * 1e3, med[1] * 1e3);
      for (int k = 2; k < K; ++k) std::printf(" %14.3f", med[k] * 1e3);
      std::printf(" %9.1f %9.1f %9.1f\n", OC * C * 4 / med[0] / 1e9, OC * C * 2 / med[1] / 1e9, OC * C * 1 / med[2] / 1e9);
    }
}
