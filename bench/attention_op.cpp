// Times one attention layer's forward and backward alone: the O(T) kernels (attention_forward /
// attention_backward, the default), their mixed-precision twins (attention_forward_bf16 / _backward_bf16,
// what --precision bf16 trains with) and the T x T probs kernels they replaced (skipped with
// --no-probs, or when B H T^2 floats would not fit). Not built by CMake; bench/attention_long.sh
// builds and runs it, or by hand:
//   g++ -O3 -march=native -std=c++20 -fopenmp -fno-math-errno -fno-trapping-math -Isrc \
//       bench/attention_op.cpp build/libjtok_lib.a -ldnnl -o build/attention_op
//   OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 build/attention_op B T H KV hd [reps] [--no-probs]
// (The key block sweep in docs/benchmarks.md compiled src/ops/attention*.cpp with -DJTOK_ATTN_KEY_BLOCK=N.)
// Prints one JSON line: the minimum over reps (after one warm-up) of process CPU seconds and of
// wall seconds for each kernel's forward and backward, and the bytes each keeps for the backward.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

struct Times {
  double fc = 1e30, fw = 1e30, bc = 1e30, bw = 1e30;
};

template <typename Fwd, typename Bwd>
static Times time_kernel(int reps, Fwd fwd, Bwd bwd) {
  Times t;
  for (int r = 0; r <= reps; ++r) {
    const double c0 = cpu_s(), w0 = wall_s();
    fwd();
    const double c1 = cpu_s(), w1 = wall_s();
    bwd();
    const double c2 = cpu_s(), w2 = wall_s();
    if (r == 0) continue;  // warm-up: page faults, oneDNN's first-call setup
    t.fc = std::min(t.fc, c1 - c0), t.fw = std::min(t.fw, w1 - w0), t.bc = std::min(t.bc, c2 - c1),
    t.bw = std::min(t.bw, w2 - w1);
  }
  return t;
}

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s B T H KV hd [reps] [--no-probs]\n", argv[0]);
    return 2;
  }
  const int64_t B = std::atol(argv[1]), T = std::atol(argv[2]), H = std::atol(argv[3]), KV = std::atol(argv[4]),
                hd = std::atol(argv[5]);
  const int reps = argc > 6 ? std::atoi(argv[6]) : 5;
  const bool probs_too = !(argc > 7 && std::strcmp(argv[7], "--no-probs") == 0);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  auto randn = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& e : x) e = nd(rng);
    return x;
  };
  auto q = randn(B * T * H * hd), k = randn(B * T * KV * hd), v = randn(B * T * KV * hd), dy = randn(B * T * H * hd);
  std::vector<float> y(q.size()), lse(static_cast<size_t>(B * H * T)), dq(q.size()), dk(k.size()), dv(v.size());
  const Times flash = time_kernel(
      reps, [&] { jtok::attention_forward(y.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd); },
      [&] {
        jtok::attention_backward(dq.data(), dk.data(), dv.data(), dy.data(), y.data(), lse.data(), q.data(), k.data(),
                                 v.data(), B, T, H, KV, hd);
      });
  std::printf("{\"B\":%ld,\"T\":%ld,\"H\":%ld,\"KV\":%ld,\"hd\":%ld,\"key_block\":%ld,\"reps\":%d,"
              "\"flash\":{\"fwd_cpu_s\":%.5f,\"fwd_s\":%.5f,\"bwd_cpu_s\":%.5f,\"bwd_s\":%.5f,\"kept_bytes\":%ld}",
              static_cast<long>(B), static_cast<long>(T), static_cast<long>(H), static_cast<long>(KV),
              static_cast<long>(hd), static_cast<long>(jtok::kAttnKeyBlock), reps, flash.fc, flash.fw, flash.bc, flash.bw,
              static_cast<long>(lse.size() * 4));
  const Times bf = time_kernel(
      reps, [&] { jtok::attention_forward_bf16(y.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd); },
      [&] {
        jtok::attention_backward_bf16(dq.data(), dk.data(), dv.data(), dy.data(), y.data(), lse.data(), q.data(),
                                      k.data(), v.data(), B, T, H, KV, hd);
      });
  std::printf(",\"bf16\":{\"fwd_cpu_s\":%.5f,\"fwd_s\":%.5f,\"bwd_cpu_s\":%.5f,\"bwd_s\":%.5f}", bf.fc, bf.fw, bf.bc,
              bf.bw);
  if (probs_too) {
    std::vector<float> P(static_cast<size_t>(B * H * T * T));
    const Times pr = time_kernel(
        reps, [&] { jtok::attention_forward_probs(y.data(), P.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd); },
        [&] {
          jtok::attention_backward_probs(dq.data(), dk.data(), dv.data(), dy.data(), P.data(), q.data(), k.data(),
                                         v.data(), B, T, H, KV, hd);
        });
    std::printf(",\"probs\":{\"fwd_cpu_s\":%.5f,\"fwd_s\":%.5f,\"bwd_cpu_s\":%.5f,\"bwd_s\":%.5f,\"kept_bytes\":%ld}", pr.fc,
                pr.fw, pr.bc, pr.bw, static_cast<long>(P.size() * 4));
  }
  std::printf("}\n");
}
