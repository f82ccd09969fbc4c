// Times MoE's expert products on the GPU in bf16: cuda::grouped_linear (one launch a product over
// every expert, the offsets on the device: what the MoE block runs) against its peer, one cuBLASLt
// product per expert (cuda::linear_forward / linear_backward over each expert's rows, the offsets
// given on the host for free: the block's path before grouped_linear, less its host copy and sync).
// One projection (x (rows, C) -> (rows, OC), the experts' gate): the forward, then the backward (dx
// and dW). Rows routed as a router would: each of N positions picks K distinct experts at random.
// Shapes: the MoE bench config's (E 16, K 2, N 2048, d 128, F 850) and a Qwen3-30B-A3B-sized layer
// (E 128, K 8, N 4096, d 2048, F 768); or one given on the command line.
// Built with the CUDA kernels (target bench_cuda_grouped; not a test: timings are no check):
//   build/bench_cuda_grouped [reps [E K N C OC]]     (default 20 reps, the two shapes)
// Prints one JSON line a shape: milliseconds a call for each and each way, TFLOP/s, and
// cublaslt_over_grouped (above 1: the grouped launch is faster).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/check.h"
#include "cuda/device_array.h"
#include "cuda/grouped_linear.h"
#include "cuda/matmul.h"
#include "cuda_bench_util.h"

namespace {

using bf16 = __nv_bfloat16;
using jtok::bench::device_randn;
using jtok::bench::event_time_ms;

struct Shape {
  const char* name;
  int64_t E, K, N, C, OC;
};

// Offsets (E+1) of N positions each routed to K distinct experts drawn at random (seeded).
std::vector<int32_t> route_offsets(const Shape& s) {
  std::mt19937_64 rng(7);
  std::vector<int32_t> counts(static_cast<size_t>(s.E), 0), experts(static_cast<size_t>(s.E));
  std::iota(experts.begin(), experts.end(), 0);
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t j = 0; j < s.K; ++j) {  // a partial Fisher-Yates draw: K distinct experts
      std::uniform_int_distribution<int64_t> pick(j, s.E - 1);
      std::swap(experts[static_cast<size_t>(j)], experts[static_cast<size_t>(pick(rng))]);
      ++counts[static_cast<size_t>(experts[static_cast<size_t>(j)])];
    }
  }
  std::vector<int32_t> off(static_cast<size_t>(s.E + 1), 0);
  std::partial_sum(counts.begin(), counts.end(), off.begin() + 1);
  return off;
}

void run(jtok::cuda::Matmul& mm, const Shape& s, int reps) {
  const std::vector<int32_t> off = route_offsets(s);
  const int64_t rows = off.back(), stride = s.C * s.OC;
  bf16 *x = device_randn(static_cast<size_t>(rows * s.C), 1), *w = device_randn(static_cast<size_t>(s.E * stride), 2, 0.05f);
  bf16 *y = device_randn(static_cast<size_t>(rows * s.OC), 3), *dx = device_randn(static_cast<size_t>(rows * s.C), 4);
  float* dw = nullptr;
  JTOK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dw), static_cast<size_t>(s.E * stride) * sizeof(float)));
  JTOK_CUDA_CHECK(cudaMemset(dw, 0, static_cast<size_t>(s.E * stride) * sizeof(float)));
  jtok::cuda::DeviceArray<int32_t> d_off;
  d_off.resize(s.E + 1);
  jtok::cuda::copy_to_device(d_off.get(), off.data(), s.E + 1);
  const jtok::cuda::ExpertGroups g{d_off.get(), s.E, rows, stride};
  const auto each_expert = [&](auto&& f) {
    for (int64_t e = 0; e < s.E; ++e)
      if (off[e + 1] > off[e]) f(e, static_cast<int64_t>(off[e]), static_cast<int64_t>(off[e + 1] - off[e]));
  };
  const double fwd = event_time_ms([&] { jtok::cuda::grouped_linear_forward<bf16>(y, x, w, g, s.C, s.OC, nullptr); },
                                   reps);
  const double fwd_lt = event_time_ms([&] {
    each_expert([&](int64_t e, int64_t r0, int64_t ne) {
      jtok::cuda::linear_forward<bf16, bf16>(mm, y + r0 * s.OC, x + r0 * s.C, w + e * stride, nullptr, ne, s.C, s.OC,
                                             false, nullptr);
    });
  }, reps);
  const double bwd = event_time_ms([&] {
    jtok::cuda::grouped_linear_backward<bf16>(dx, dw, y, x, w, g, s.C, s.OC, nullptr);
  }, reps);
  const double bwd_lt = event_time_ms([&] {
    each_expert([&](int64_t e, int64_t r0, int64_t ne) {
      jtok::cuda::linear_backward<bf16, float>(mm, dx + r0 * s.C, dw + e * stride, y + r0 * s.OC, x + r0 * s.C,
                                               w + e * stride, ne, s.C, s.OC, nullptr);
    });
  }, reps);
  const double gf = 2.0 * static_cast<double>(rows) * s.C * s.OC / 1e9;  // one product's GFLOP
  std::printf("{\"shape\": \"%s\", \"E\": %lld, \"K\": %lld, \"N\": %lld, \"C\": %lld, \"OC\": %lld, \"rows\": %lld, "
              "\"fwd_ms\": %.4f, \"fwd_cublaslt_ms\": %.4f, \"bwd_ms\": %.4f, \"bwd_cublaslt_ms\": %.4f, "
              "\"fwd_tflops\": %.1f, \"bwd_tflops\": %.1f, \"cublaslt_over_grouped\": %.3f}\n",
              s.name, static_cast<long long>(s.E), static_cast<long long>(s.K), static_cast<long long>(s.N),
              static_cast<long long>(s.C), static_cast<long long>(s.OC), static_cast<long long>(rows), fwd, fwd_lt, bwd,
              bwd_lt, gf / fwd, 2 * gf / bwd, (fwd_lt + bwd_lt) / (fwd + bwd));
  for (void* p : {static_cast<void*>(x), static_cast<void*>(w), static_cast<void*>(y), static_cast<void*>(dx),
                  static_cast<void*>(dw)})
    cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc >= 2 ? std::atoi(argv[1]) : 20;
  std::vector<Shape> shapes{{"bench_moe", 16, 2, 2048, 128, 850}, {"qwen3_30b_a3b", 128, 8, 4096, 2048, 768}};
  if (argc >= 7) {
    shapes = {{"given", std::atoll(argv[2]), std::atoll(argv[3]), std::atoll(argv[4]), std::atoll(argv[5]),
               std::atoll(argv[6])}};
  } else if (argc != 1 && argc != 2) {
    std::fprintf(stderr, "usage: bench_cuda_grouped [reps [E K N C OC]]\n");
    return 2;
  }
  for (const Shape& s : shapes)
    if (reps < 1 || s.E < 1 || s.K < 1 || s.K > s.E || s.N < 1 || s.C < 1 || s.OC < 1) {
      std::fprintf(stderr, "bench_cuda_grouped: reps %d, E %lld, K %lld, N %lld, C %lld, OC %lld: each at least 1, K <= E\n",
                   reps, static_cast<long long>(s.E), static_cast<long long>(s.K), static_cast<long long>(s.N),
                   static_cast<long long>(s.C), static_cast<long long>(s.OC));
      return 2;
    }
  try {
    jtok::cuda::Matmul mm;
    for (const Shape& s : shapes) run(mm, s, reps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_grouped: %s\n", e.what());
    return 1;
  }
  return 0;
}
