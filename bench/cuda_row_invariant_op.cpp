// Times a decode step's products on the GPU in bf16: cuda::row_invariant_linear (the decode steps'
// products) against cuBLASLt (cuda::linear_forward), on Qwen3-0.6B's shapes (q 1024 -> 2048, k / v
// 1024 -> 1024, q | k | v 1024 -> 4096, gate / up 1024 -> 3072, o 2048 -> 1024, down 3072 -> 1024, the LM head 1024 ->
// 151936, fp32 logits) at M = 1, 4, 16 rows, by cudaEvent after two warm-up calls. Each call reads
// the next of enough weight copies to pass 256 MiB, so the weights come from HBM, not L2 (50 MiB).
// Where the input is the hidden size (C 1024: an RMSNorm's output in the decoder) also the product
// with the norm inside (RowNorm, the decoder's decode steps) against rmsnorm_forward then the
// product, two launches (normed_us, norm_then_us). And the same product of int8 weights
// (row_invariant_linear_q8: an int8 export's decode steps; q8_us, q8_gbs of its int8 bytes, and
// q8_speedup = row_invariant_us / q8_us: whether int8 pays at that shape and M). And its tensor-core
// twin (row_invariant_linear_mma: mma_us, mma_gbs, mma_speedup = row_invariant_us / mma_us: whether
// the tensor cores keep a 16-row step weight streaming, and cost nothing at 1 row; mma_normed_us
// beside normed_us: its form with the norm inside, the decoder's q | k | v, gate | up and LM head;
// router_us: a JTok-M router's normed product alone (5 fp32 columns, n_e 5), side_us: the normed
// product and the router's in one launch (row_invariant_linear_and_side, the decoder's q | k | v and
// router): what the shared launch saves is normed_us + router_us - side_us).
// Then an MoE decode step's routed experts at Qwen3-30B-A3B's shape (d 2048, F 768, 128 experts, 8 a
// row; row r's slot j takes expert (r * 8 + j) * 37 mod 128: M 1 reads 8 experts, M 16 all 128):
// row_invariant_expert_swiglu then _linear in bf16 against their int8 twins (experts_us,
// experts_q8_us, the active experts' GB/s, q8_speedup). And the int8-only prefill's price a layer:
// dequantize_q8_rows of a Qwen3-0.6B layer's matrices (15.7M values) into bf16 (dequant_us, its GB/s
// of int8 read and bf16 written; x 28 layers is what `--int8-decode only` adds to a prefill step).
// Built with the CUDA kernels (target bench_cuda_row_invariant; not a test: timings are no check):
//   build/bench_cuda_row_invariant [reps] [tiny]     (default 50; tiny: three small shapes, 1 MiB of
//                                                    copies: the emulated GPU's run, its code not its timings)
// Prints one JSON line a (shape, M): microseconds a call and the weights' GB/s for each (and the
// normed pair's microseconds).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/check.h"
#include "cuda/matmul.h"
#include "cuda/q8_dequant.h"
#include "cuda/rmsnorm.h"
#include "cuda/row_invariant_linear.h"
#include "cuda/row_invariant_mma.h"
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

// Device memory of n bytes set to one byte value (weights whose values no timing depends on).
template <typename T>
T* device_filled(size_t n, int byte) {
  T* p = nullptr;
  JTOK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)));
  JTOK_CUDA_CHECK(cudaMemset(p, byte, n * sizeof(T)));
  return p;
}

// row_invariant_linear_q8's microseconds a call, its int8 weights cycled through 256 MiB of copies
// (the values: a constant byte and scale, no timing depends on them).
template <typename Out>
double q8_us(const Shape& s, int64_t M, const bf16* x, Out* out, int reps) {
  const size_t wn = static_cast<size_t>(s.C * s.OC), copies = (g_copy_bytes + wn - 1) / wn;
  std::vector<int8_t*> q(copies);
  float* scale = device_filled<float>(static_cast<size_t>(s.OC), 0);
  for (int8_t*& p : q) p = device_filled<int8_t>(wn, 3);
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

// Microseconds a call of f(i) (i: the call's index, for the weight copy it reads).
template <typename F>
double call_us(F f, int reps) {
  return 1e3 * jtok::bench::event_time_ms(f, reps);
}

// The product with the norm inside (RowNorm), rmsnorm_forward then the product, the tensor cores'
// product with the norm inside, a JTok-M router's normed product (5 columns) alone, and the product
// with the router beside it in one launch: microseconds each.
struct NormedUs {
  double normed, norm_then, mma_normed, router, side;
};
template <typename Out, typename W>
NormedUs normed_us(const Shape& s, int64_t M, const bf16* x, Out* out, W weight, int reps) {
  bf16* gain = device_randn(static_cast<size_t>(s.C), 3, 1.0f);
  bf16* xn = device_randn(static_cast<size_t>(M * s.C), 2, 1.0f);
  float* rstd = nullptr;
  JTOK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&rstd), static_cast<size_t>(M) * sizeof(float)));
  const jtok::cuda::RowNorm<bf16> norm{gain, 1e-6f};
  const double normed = call_us(
      [&](int i) {
        jtok::cuda::row_invariant_linear<bf16, Out>(out, x, weight(i), nullptr, M, s.C, s.OC, false, nullptr, norm);
      },
      reps);
  const double norm_then = call_us(
      [&](int i) {
        jtok::cuda::rmsnorm_forward<bf16>(xn, rstd, x, gain, M, s.C, 1e-6f, nullptr);
        jtok::cuda::row_invariant_linear<bf16, Out>(out, xn, weight(i), nullptr, M, s.C, s.OC, false, nullptr);
      },
      reps);
  const double mma_normed = call_us(
      [&](int i) {
        jtok::cuda::row_invariant_linear_mma<Out>(out, x, weight(i), nullptr, M, s.C, s.OC, false, nullptr, norm);
      },
      reps);
  constexpr int64_t kRouter = 5;  // JTok-M's n_e: the router's fp32 logits
  bf16* router = device_randn(static_cast<size_t>(kRouter * s.C), 4, 0.05f);
  float* logits = nullptr;
  JTOK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&logits), static_cast<size_t>(M * kRouter) * sizeof(float)));
  const double router_us = call_us(
      [&](int) {
        jtok::cuda::row_invariant_linear<bf16, float>(logits, x, router, nullptr, M, s.C, kRouter, false, nullptr,
                                                      norm);
      },
      reps);
  double side = 0;
  if constexpr (std::is_same_v<Out, bf16>)
    side = call_us(
        [&](int i) {
          jtok::cuda::row_invariant_linear_and_side<bf16, bf16>(out, x, weight(i), nullptr, M, s.C, s.OC, false, logits,
                                                                router, kRouter, nullptr, norm);
        },
        reps);
  for (void* p : {static_cast<void*>(gain), static_cast<void*>(xn), static_cast<void*>(rstd),
                  static_cast<void*>(router), static_cast<void*>(logits)})
    cudaFree(p);
  return {normed, norm_then, mma_normed, router_us, side};
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
  const double ri = call_us(
      [&](int i) {
        jtok::cuda::row_invariant_linear<bf16, Out>(out, x, weight(i), nullptr, M, s.C, s.OC, false, nullptr);
      },
      reps);
  const double lt = call_us(
      [&](int i) {
        jtok::cuda::linear_forward<bf16, Out>(mm, out, x, weight(i), nullptr, M, s.C, s.OC, false, nullptr);
      },
      reps);
  const double mma = call_us(
      [&](int i) {
        jtok::cuda::row_invariant_linear_mma<Out>(out, x, weight(i), nullptr, M, s.C, s.OC, false, nullptr);
      },
      reps);
  const double gb = static_cast<double>(wbytes) / 1e9, q8 = q8_us<Out>(s, M, x, out, reps);
  std::printf(
      "{\"shape\": \"%s\", \"C\": %lld, \"OC\": %lld, \"M\": %lld, \"row_invariant_us\": %.2f, "
      "\"row_invariant_gbs\": %.0f, \"cublaslt_us\": %.2f, \"cublaslt_gbs\": %.0f, \"q8_us\": %.2f, "
      "\"q8_gbs\": %.0f, \"q8_speedup\": %.2f, \"mma_us\": %.2f, \"mma_gbs\": %.0f, \"mma_speedup\": %.2f",
      s.name, static_cast<long long>(s.C), static_cast<long long>(s.OC), static_cast<long long>(M), ri,
      gb / (ri * 1e-6), lt, gb / (lt * 1e-6), q8, gb / 2 / (q8 * 1e-6), ri / q8, mma, gb / (mma * 1e-6), ri / mma);
  if (s.C == g_hidden) {
    const NormedUs n = normed_us(s, M, x, out, weight, reps);
    std::printf(", \"normed_us\": %.2f, \"norm_then_us\": %.2f, \"mma_normed_us\": %.2f, \"router_us\": %.2f", n.normed,
                n.norm_then, n.mma_normed, n.router);
    if (n.side > 0) std::printf(", \"side_us\": %.2f", n.side);
  }
  std::printf("}\n");
  for (bf16* p : w) cudaFree(p);
  cudaFree(x);
  cudaFree(out);
}

// The routed experts' products of an M-row decode step, bf16 and int8 (the header's assignment).
void run_experts(int64_t M, int reps, bool tiny) {
  const int64_t d = tiny ? 64 : 2048, F = tiny ? 32 : 768, E = tiny ? 8 : 128, K = tiny ? 2 : 8;
  std::vector<std::vector<int32_t>> rows_of(static_cast<size_t>(E));
  for (int64_t r = 0; r < M; ++r)
    for (int64_t j = 0; j < K; ++j)
      rows_of[static_cast<size_t>((r * K + j) * 37 % E)].push_back(static_cast<int32_t>(r));
  std::vector<int32_t> offsets{0}, experts;
  for (int64_t e = 0; e < E; ++e) {
    offsets.push_back(offsets.back() + static_cast<int32_t>(rows_of[static_cast<size_t>(e)].size()));
    if (!rows_of[static_cast<size_t>(e)].empty()) experts.push_back(static_cast<int32_t>(e));
  }
  const int64_t NK = M * K, active = static_cast<int64_t>(experts.size()), per = 3 * F * d;
  int32_t* ints = device_filled<int32_t>(offsets.size() + experts.size() + 1, 0);
  JTOK_CUDA_CHECK(cudaMemcpy(ints, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
  JTOK_CUDA_CHECK(cudaMemcpy(ints + offsets.size(), experts.data(), experts.size() * 4, cudaMemcpyHostToDevice));
  const int32_t count = static_cast<int32_t>(active);
  JTOK_CUDA_CHECK(cudaMemcpy(ints + offsets.size() + experts.size(), &count, 4, cudaMemcpyHostToDevice));
  jtok::cuda::ExpertRows g{ints, ints + offsets.size(), ints + offsets.size() + experts.size(), std::min(E, NK), M,
                           per};
  g.scale_stride = 2 * F + d;
  bf16 *w = device_filled<bf16>(static_cast<size_t>(E * per), 0x3c), *x = device_randn(static_cast<size_t>(NK * d), 4);
  bf16 *act = device_filled<bf16>(static_cast<size_t>(NK * F), 0),
       *eo = device_filled<bf16>(static_cast<size_t>(NK * d), 0);
  int8_t* q = device_filled<int8_t>(static_cast<size_t>(E * per), 3);
  float* scale = device_filled<float>(static_cast<size_t>(E * (2 * F + d)), 0);
  const jtok::cuda::Q8Weight gu{q, scale}, down{q + 2 * F * d, scale + 2 * F};
  const double bf =
      1e3 * jtok::bench::event_time_ms(
                [&] {
                  jtok::cuda::row_invariant_expert_swiglu<bf16>(act, x, w, g, d, F, nullptr);
                  jtok::cuda::row_invariant_expert_linear<bf16, bf16>(eo, act, w + 2 * F * d, g, F, d, nullptr);
                },
                reps);
  const double i8 = 1e3 * jtok::bench::event_time_ms(
                              [&] {
                                jtok::cuda::row_invariant_expert_swiglu_q8<bf16>(act, x, gu, g, d, F, nullptr);
                                jtok::cuda::row_invariant_expert_linear_q8<bf16>(eo, act, down, g, F, d, nullptr);
                              },
                              reps);
  const double gb = static_cast<double>(active * per * 2) / 1e9;
  std::printf(
      "{\"shape\": \"experts\", \"d\": %lld, \"F\": %lld, \"experts\": %lld, \"M\": %lld, "
      "\"active_experts\": %lld, \"experts_us\": %.2f, \"experts_gbs\": %.0f, \"experts_q8_us\": %.2f, "
      "\"experts_q8_gbs\": %.0f, \"q8_speedup\": %.2f}\n",
      static_cast<long long>(d), static_cast<long long>(F), static_cast<long long>(E), static_cast<long long>(M),
      static_cast<long long>(active), bf, gb / (bf * 1e-6), i8, gb / 2 / (i8 * 1e-6), bf / i8);
  for (void* p : {static_cast<void*>(ints), static_cast<void*>(w), static_cast<void*>(x), static_cast<void*>(act),
                  static_cast<void*>(eo), static_cast<void*>(q), static_cast<void*>(scale)})
    cudaFree(p);
}

// dequantize_q8_rows of one Qwen3-0.6B layer's int8 matrices (q | k | v, o, gate | up, down) into bf16.
void run_dequant(int reps, bool tiny) {
  const int64_t d = tiny ? 64 : 1024;
  const std::vector<std::pair<int64_t, int64_t>> ms =
      tiny ? std::vector<std::pair<int64_t, int64_t>>{{256, 64}, {64, 128}, {384, 64}, {64, 192}}
           : std::vector<std::pair<int64_t, int64_t>>{{4096, d}, {d, 2048}, {6144, d}, {d, 3072}};
  std::vector<jtok::cuda::Q8Run> runs;
  int64_t rows = 0, values = 0;
  for (const auto& [r, c] : ms) runs.push_back({rows, r, c, values}), rows += r, values += r * c;
  jtok::cuda::Q8Run* runs_dev = nullptr;
  JTOK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&runs_dev), runs.size() * sizeof(jtok::cuda::Q8Run)));
  JTOK_CUDA_CHECK(cudaMemcpy(runs_dev, runs.data(), runs.size() * sizeof(jtok::cuda::Q8Run), cudaMemcpyHostToDevice));
  int8_t* q = device_filled<int8_t>(static_cast<size_t>(values), 3);
  float* scale = device_filled<float>(static_cast<size_t>(rows), 0);
  bf16* out = device_filled<bf16>(static_cast<size_t>(values), 0);
  const double us = 1e3 * jtok::bench::event_time_ms(
                              [&] {
                                jtok::cuda::dequantize_q8_rows<bf16>(out, q, scale, runs_dev,
                                                                     static_cast<int64_t>(runs.size()), rows, nullptr);
                              },
                              reps);
  std::printf("{\"shape\": \"dequant_layer\", \"values\": %lld, \"dequant_us\": %.2f, \"dequant_gbs\": %.0f}\n",
              static_cast<long long>(values), us, static_cast<double>(3 * values + 4 * rows) / 1e3 / us);
  for (void* p :
       {static_cast<void*>(runs_dev), static_cast<void*>(q), static_cast<void*>(scale), static_cast<void*>(out)})
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
        else
          run<bf16>(mm, s, M, reps);
      }
    for (int64_t M : {1, 4, 16}) run_experts(M, reps, tiny);
    run_dequant(reps, tiny);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_row_invariant: %s\n", e.what());
    return 1;
  }
  return 0;
}
