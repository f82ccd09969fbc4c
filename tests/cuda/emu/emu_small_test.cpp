// Two small families on the CPU through their real launchers (tests/cuda/emu), each against a
// double-precision loop (the GPU tests' twins for gemm_ref, ops/linear's gemm_f32, multiply by
// oneDNN: not linked here), at the GPU tests' tolerances (tests/cuda/test_cuda_ops.cpp):
// - gemm_ref, all four transpose combinations, alpha 1.5, beta 0.5, row-major C (M,N), op(A) (M,K).
// - sum_and_squares of 100,003 values with a mean away from zero.
#include <gtest/gtest.h>

#include <utility>

#include "cuda/gemm_ref.h"
#include "cuda/stats.h"
#include "cuda_case.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

TEST(EmulatedOps, GemmRef) {
  const int64_t M = 33, N = 20, K = 37;
  const auto a = randn(M * K, 51), b = randn(K * N, 52), c0 = randn(M * N, 53);
  CudaCase c{"gemm_ref", "M 33, N 20, K 37, beta 0.5", {1e-6, 1e-2}};
  static const char* const kNames[4] = {"C nn", "C tn", "C nt", "C tt"};  // op(A), op(B) transposed?
  auto lds = [&](bool ta, bool tb) { return std::pair<int64_t, int64_t>{ta ? M : K, tb ? K : N}; };
  c.cpu = [&](DType t) {
    const auto at = to_dtype(a, t), bt = to_dtype(b, t), ct = to_dtype(c0, t);
    Outputs o;
    for (int k = 0; k < 4; ++k) {
      const bool ta = k & 1, tb = k & 2;
      const auto [lda, ldb] = lds(ta, tb);
      std::vector<float> out(M * N);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t p = 0; p < K; ++p)
            s += static_cast<double>(ta ? at[p * lda + i] : at[i * lda + p]) * (tb ? bt[j * ldb + p] : bt[p * ldb + j]);
          out[i * N + j] = static_cast<float>(1.5 * s + 0.5 * ct[i * N + j]);
        }
      o.push_back({kNames[k], out});
    }
    return o;
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename T>(T) {
      auto da = upload<T>(a), db = upload<T>(b);
      Outputs o;
      for (int k = 0; k < 4; ++k) {
        const bool ta = k & 1, tb = k & 2;
        auto dc = upload<T>(c0);
        jtok::cuda::gemm_ref<T, T>(ta, tb, M, N, K, 1.5f, da.get(), lds(ta, tb).first, db.get(), lds(ta, tb).second,
                                   0.5f, dc.get(), N, nullptr);
        o.push_back({kNames[k], download(dc)});
      }
      return o;
    });
  };
  run_case(c);
}

TEST(EmulatedOps, SumAndSquares) {
  std::vector<float> x = randn(100003, 77);
  for (float& v : x) v += 0.5f;
  CudaCase c{"sum_and_squares", "n 100003", {1e-6, 1e-6}};
  c.cpu = [&](DType t) {
    double s = 0, ss = 0;
    for (float v : to_dtype(x, t)) s += v, ss += static_cast<double>(v) * v;
    return Outputs{{"sum", {static_cast<float>(s)}}, {"squares", {static_cast<float>(ss)}}};
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename G>(G) {
      DeviceBuffer<G> dx = upload<G>(x);
      DeviceBuffer<double> scratch(jtok::cuda::sum_and_squares_scratch()), out(2);
      jtok::cuda::sum_and_squares(out.get(), dx.get(), static_cast<int64_t>(x.size()), scratch.get(), nullptr);
      const std::vector<double> got = download_exact(out);
      return Outputs{{"sum", {static_cast<float>(got[0])}}, {"squares", {static_cast<float>(got[1])}}};
    });
  };
  run_case(c);
  expect_deterministic(c, DType::bf16);
}

}  // namespace
