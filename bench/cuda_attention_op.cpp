// Times one attention layer's forward and backward on the GPU in bf16: the tensor-core kernels
// (cuda::attention_forward / attention_backward; the forward and dq also with 32 query rows a warp,
// attention_forward_wide and attention_backward_wide: fwd_wide_ms, bwd_wide_ms) and the scalar-tile kernels
// (attention_forward_tiles / attention_backward_tiles), by cudaEvent after two warm-up calls. Built
// with the CUDA kernels (target bench_cuda_attention; not a test: timings are no check, and the
// sanitizer runs of test_cuda_ops would take hours over this size):
//   build/bench_cuda_attention [B T H KV hd [reps]]     (default config b: 16 1024 12 12 64 10)
//   build/bench_cuda_attention 16 128 4 2 32            (the MoE bench config's layer: hd 32, GQA 4 / 2)
// hd is 32, 64 or 128 (cuda/attention.h; another is refused by value).
// Prints one JSON line: milliseconds per call and TFLOP/s by the causal product count (forward
// 2 B H T^2 hd, backward 2.5 times that; the dq / dk-dv split recomputes the scores on top).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "cuda/attention.h"
#include "cuda/check.h"
#include "cuda_bench_util.h"

namespace {

using bf16 = __nv_bfloat16;

using jtok::bench::device_randn;
using jtok::bench::event_time_ms;

struct Shape {
  int64_t B, T, H, KV, hd;
};

void run(const Shape& s, int reps) {
  const size_t nq = static_cast<size_t>(s.B * s.T * s.H * s.hd), nkv = static_cast<size_t>(s.B * s.T * s.KV * s.hd);
  const size_t rows = static_cast<size_t>(s.B * s.H * s.T);
  bf16 *q = device_randn(nq, 1), *k = device_randn(nkv, 2), *v = device_randn(nkv, 3), *dout = device_randn(nq, 4);
  bf16 *out = device_randn(nq, 5), *dq = device_randn(nq, 6), *dk = device_randn(nkv, 7), *dv = device_randn(nkv, 8);
  float *lse = nullptr, *row_terms = nullptr;
  JTOK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&lse), rows * sizeof(float)));
  JTOK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&row_terms), rows * sizeof(float)));
  using jtok::cuda::attention_backward, jtok::cuda::attention_backward_tiles;
  using jtok::cuda::attention_forward, jtok::cuda::attention_forward_tiles;
  const double f_tc =
      event_time_ms([&] { attention_forward<bf16>(out, lse, q, k, v, s.B, s.T, s.H, s.KV, s.hd, nullptr); }, reps);
  const double b_tc = event_time_ms(
      [&] {
        attention_backward<bf16>(dq, dk, dv, row_terms, dout, out, lse, q, k, v, s.B, s.T, s.H, s.KV, s.hd, nullptr, {},
                                 false);  // written over, as the model runs it
      },
      reps);
  // 32 query rows a warp (attention_forward_wide: the same bits; hd 128 runs the kernel above).
  const double f_wide = event_time_ms(
      [&] { jtok::cuda::attention_forward_wide(out, lse, q, k, v, s.B, s.T, s.H, s.KV, s.hd, nullptr); }, reps);
  const double b_wide = event_time_ms(
      [&] {
        jtok::cuda::attention_backward_wide(dq, dk, dv, row_terms, dout, out, lse, q, k, v, s.B, s.T, s.H, s.KV, s.hd,
                                            nullptr, {}, false);
      },
      reps);
  const double f_tiles =
      event_time_ms([&] { attention_forward_tiles<bf16>(out, lse, q, k, v, s.B, s.T, s.H, s.KV, s.hd, nullptr); },
                    reps);
  const double b_tiles = event_time_ms(
      [&] {
        attention_backward_tiles<bf16>(dq, dk, dv, row_terms, dout, out, lse, q, k, v, s.B, s.T, s.H, s.KV, s.hd,
                                       nullptr, {}, false);
      },
      reps);
  const double tflop = 2.0 * s.B * s.H * static_cast<double>(s.T) * s.T * s.hd / 1e12;
  std::printf(
      "{\"B\": %lld, \"T\": %lld, \"H\": %lld, \"KV\": %lld, \"hd\": %lld, \"fwd_ms\": %.4f, \"fwd_tflops\": %.1f, "
      "\"bwd_ms\": %.4f, \"bwd_tflops\": %.1f, \"fwd_wide_ms\": %.4f, \"fwd_wide_tflops\": %.1f, "
      "\"bwd_wide_ms\": %.4f, \"bwd_wide_tflops\": %.1f, \"fwd_tiles_ms\": %.4f, \"bwd_tiles_ms\": %.4f}\n",
      static_cast<long long>(s.B), static_cast<long long>(s.T), static_cast<long long>(s.H),
      static_cast<long long>(s.KV), static_cast<long long>(s.hd), f_tc, tflop / (f_tc / 1e3), b_tc,
      2.5 * tflop / (b_tc / 1e3), f_wide, tflop / (f_wide / 1e3), b_wide, 2.5 * tflop / (b_wide / 1e3), f_tiles,
      b_tiles);
  for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(dout),
                  static_cast<void*>(out), static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv),
                  static_cast<void*>(lse), static_cast<void*>(row_terms)})
    cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  Shape s{16, 1024, 12, 12, 64};
  int reps = 10;
  if (argc >= 6) s = Shape{std::atoll(argv[1]), std::atoll(argv[2]), std::atoll(argv[3]), std::atoll(argv[4]),
                           std::atoll(argv[5])};
  if (argc >= 7) reps = std::atoi(argv[6]);
  try {
    run(s, reps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_attention: %s\n", e.what());
    return 1;
  }
  return 0;
}
