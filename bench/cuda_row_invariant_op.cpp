// Times a decode step's products on the GPU in bf16: cuda::row_invariant_linear (the decode steps'
// products) against cuBLASLt (cuda::linear_forward), on Qwen3-0.6B's shapes (q 1024 -> 2048, k / v
// 1024 -> 1024, q | k | v 1024 -> 4096, gate / up 1024 -> 3072, o 2048 -> 1024, down 3072 -> 1024, the LM head 1024 ->
// 151936, fp32 logits) at M = 1, 4, 16 rows, by cudaEvent after two warm-up calls. Each call reads
// the next of enough weight copies to pass 256 MiB, so the weights come from HBM, not L2 (50 MiB).
// Where the input is the hidden size (C 1024: an RMSNorm's output in the decoder) also the product
// with the norm inside (RowNorm, the decoder's decode steps) against rmsnorm_forward then the
// product, two launches (normed_us, norm_then_us). And the same product of int8 weights
// (row_invariant_linear_q8: an int8 export's decode steps; q8_us, q8_gbs of its int8 bytes, and
// q8_speedup = row_invariant_us / q8_us: whether int8 pays at that shape and M).
// Built with the CUDA kernels (target bench_cuda_row_invariant; not a test: timings are no check):
//   build/bench_cuda_row_invariant [reps] [tiny]     (default 50; tiny: three small shapes, 1 MiB of
//                                                    copies: the emulated GPU's run, its code not its timings)
// Prints one JSON line a (shape, M): microseconds a call and the weights' GB/s for each (and the
// normed pair's microseconds).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/matmul.h"
#include "cuda/rmsnorm.h"
#include "cuda/row_invariant_linear.h"
#include "cuda_bench_util.h"

namespace {

using bf16 = __nv_bfloat16;

using jtok::bench::device_randn;

// Each shape's weights cycle through copies of at least this many bytes (HBM, not L2); tiny: 1 MiB.
size_t g_copy_bytes = size_t{256} << 20;
int64_t g_hidden = 1024;  // the products whose input is an RMSNorm's output (the normed pair)

struct Shape {
  const char* name;
  int64_t C, OC;
};

// row_invariant_linear_q8's microseconds a call, its int8 weights cycled through 256 MiB of copies
// (the values: a constant byte and scale, no timing depends on them).
template <typename Out>
double q8_us(const Shape& s, int64_t M, const bf16* x, Out* out, int reps) {
  const size_t wn = static_cast<size_t>(s.C * s.OC), copies = (g_copy_bytes + wn - 1) / wn;
  std::vector<int8_t*> q(copies);
  float* scale = nullptr;
  JTOK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&scale), static_cast<size_t>(s.OC) * sizeof(float)));
  JTOK_CUDA_CHECK(cudaMemset(scale, 0, static_cast<size_t>(s.OC) * sizeof(float)));
  for (int8_t*& p : q) {
    JTOK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), wn));
    JTOK_CUDA_CHECK(cudaMemset(p, 3, wn));
  }
  const double us =
      1e3 * jtok::bench::event_time_ms(
                [&](int i) {
                  const jtok::cuda::Q8Weight w{q[static_cast<size_t>(i) % copies], scale};
                  jtok::cuda::row_invariant_linear_q8<bf16, Out>(out, x, w, nullptr, M, s.C, s.OC, false, nullptr);
                },
                reps);
  for (int8_t* p : q) cudaFree(p);
  cudaFree(scale);
  return us;
}

// One shape at M rows: bf16 out, or fp32 (the LM head's logits).
template <typename Out>
void run(jtok::cuda::Matmul& mm, const Shape& s, int64_t M, int reps) {
  const size_t wn = static_cast<size_t>(s.C * s.OC), wbytes = wn * sizeof(bf16);
  const size_t copies = (g_copy_bytes + wbytes - 1) / wbytes;
  std::vector<bf16*> w;
  for (size_t i = 0; i < copies; ++i) w.push_back(device_randn(wn, 10 + i, 0.05f));
  bf16* x = device_randn(static_cast<size_t>(M * s.C), 1, 1.0f);
  Out* out = nullptr;
  JTOK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), static_cast<size_t>(M * s.OC) * sizeof(Out)));
  const auto weight = [&](int i) { return w[static_cast<size_t>(i) % copies]; };
  const double ri = 1e3 * jtok::bench::event_time_ms([&](int i) {
    jtok::cuda::row_invariant_linear<bf16, Out>(out, x, weight(i), nullptr, M, s.C, s.OC, false, nullptr);
  }, reps);
  const double lt = 1e3 * jtok::bench::event_time_ms([&](int i) {
    jtok::cuda::linear_forward<bf16, Out>(mm, out, x, weight(i), nullptr, M, s.C, s.OC, false, nullptr);
  }, reps);
  double normed = 0, norm_then = 0;
  bf16 *gain = nullptr, *xn = nullptr;
  float* rstd = nullptr;
  if (s.C == g_hidden) {
    gain = device_randn(static_cast<size_t>(s.C), 3, 1.0f);
    xn = device_randn(static_cast<size_t>(M * s.C), 2, 1.0f);
    JTOK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&rstd), static_cast<size_t>(M) * sizeof(float)));
    const jtok::cuda::RowNorm<bf16> norm{gain, 1e-6f};
    normed = 1e3 * jtok::bench::event_time_ms([&](int i) {
      jtok::cuda::row_invariant_linear<bf16, Out>(out, x, weight(i), nullptr, M, s.C, s.OC, false, nullptr, norm);
    }, reps);
    norm_then = 1e3 * jtok::bench::event_time_ms([&](int i) {
      jtok::cuda::rmsnorm_forward<bf16>(xn, rstd, x, gain, M, s.C, 1e-6f, nullptr);
      jtok::cuda::row_invariant_linear<bf16, Out>(out, xn, weight(i), nullptr, M, s.C, s.OC, false, nullptr);
    }, reps);
  }
  const double gb = static_cast<double>(wbytes) / 1e9, q8 = q8_us<Out>(s, M, x, out, reps);
  std::printf(
      "{\"shape\": \"%s\", \"C\": %lld, \"OC\": %lld, \"M\": %lld, \"row_invariant_us\": %.2f, "
      "\"row_invariant_gbs\": %.0f, \"cublaslt_us\": %.2f, \"cublaslt_gbs\": %.0f, \"q8_us\": %.2f, "
      "\"q8_gbs\": %.0f, \"q8_speedup\": %.2f",
      s.name, static_cast<long long>(s.C), static_cast<long long>(s.OC), static_cast<long long>(M), ri,
      gb / (ri * 1e-6), lt, gb / (lt * 1e-6), q8, gb / 2 / (q8 * 1e-6), ri / q8);
  if (s.C == g_hidden) std::printf(", \"normed_us\": %.2f, \"norm_then_us\": %.2f", normed, norm_then);
  std::printf("}\n");
  for (bf16* p : w) cudaFree(p);
  for (void* p : {static_cast<void*>(x), static_cast<void*>(out), static_cast<void*>(gain), static_cast<void*>(xn),
                  static_cast<void*>(rstd)})
    cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc >= 2 ? std::atoi(argv[1]) : 50;
  const bool tiny = argc >= 3 && std::string(argv[2]) == "tiny";  // the emulated GPU's check (emulate_kernels.sh)
  const std::vector<Shape> shapes =
      tiny ? std::vector<Shape>{{"q", 64, 128}, {"down", 192, 64}, {"lm_head", 64, 1000}}
           : std::vector<Shape>{{"q", 1024, 2048},        {"k_v", 1024, 1024}, {"qkv", 1024, 4096},
                                {"gate_up", 1024, 3072},  {"o", 2048, 1024},   {"down", 3072, 1024},
                                {"lm_head", 1024, 151936}};
  if (tiny) g_copy_bytes = size_t{1} << 20, g_hidden = 64;
  try {
    jtok::cuda::Matmul mm;
    for (const Shape& s : shapes)
      for (int64_t M : {1, 4, 16}) {
        if (std::string(s.name) == "lm_head")
          run<float>(mm, s, M, reps);  // fp32 logits
        else run<bf16>(mm, s, M, reps);
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_row_invariant: %s\n", e.what());
    return 1;
  }
  return 0;
}
