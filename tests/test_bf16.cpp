// bf16 mixed-precision matrix products (ops/linear.h gemm_bf16, train/precision.h): on a CPU with
// AVX-512 BF16 the product equals the double-accumulated product of the bf16-rounded inputs (fp32
// accumulation error only) and stays within bf16's rounding of the fp32 product; gemm() follows the
// process precision. Without AVX-512 BF16 the training precision falls back to fp32 and says so.
#include <gtest/gtest.h>

#include "core/error.h"
#include "op_test_util.h"
#include "ops/linear.h"
#include "ops/lowp_linear.h"
#include "train/precision.h"

using namespace jtok;
using namespace jtok::testing;

namespace {

// C = alpha op(A) op(B) + beta C in double, from inputs already rounded as `round` says.
std::vector<float> reference(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const std::vector<float>& A,
                             int64_t lda, const std::vector<float>& B, int64_t ldb, float beta, std::vector<float> C,
                             int64_t ldc, bool round) {
  auto r = [&](float x) { return round ? bf16_to_f32(f32_to_bf16(x)) : x; };
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        const float a = ta ? A[k * lda + i] : A[i * lda + k];
        const float b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += static_cast<double>(r(a)) * r(b);
      }
      C[i * ldc + j] = static_cast<float>(alpha * s + beta * C[i * ldc + j]);
    }
  return C;
}

}  // namespace

TEST(Bf16Matmul, MatchesRoundedReferenceEveryLayout) {
  if (!bf16_matmul_supported()) {  // the fallback is what such a host runs: it must say so
    const PrecisionReport r = apply_training_precision("bf16");
    EXPECT_EQ(r.used, "fp32");
    EXPECT_NE(r.line.find("no AVX-512 BF16"), std::string::npos) << r.line;
    EXPECT_EQ(matmul_precision(), MatmulPrecision::fp32);
    return;
  }
  const int64_t M = 37, N = 29, K = 70;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f})
        for (int64_t pad : {0, 3}) {  // ldc == N, and C a column block of a wider matrix
          const float alpha = beta == 0.0f ? 1.0f : 0.5f;
          const int64_t lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + pad;
          auto A = randn((ta ? K : M) * lda, 1), B = randn((tb ? N : K) * ldb, 2), C = randn(M * ldc, 3);
          std::vector<float> got = C;
          gemm_bf16(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, got.data(), ldc);
          const auto want = reference(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, true);
          const auto exact = reference(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, false);
          const std::string at = std::string(ta ? "T" : "N") + (tb ? "T" : "N") + " beta " + std::to_string(beta) +
                                 " ldc " + std::to_string(ldc);
          EXPECT_LT(rel_err(got, want), 2e-6) << at;   // fp32 accumulation of the rounded products
          const double e = rel_err(got, exact);        // bf16 keeps 8 bits: ~2^-9 per input
          EXPECT_LT(e, 8e-3) << at;
          EXPECT_GT(e, 1e-5) << at;                    // it did round to bf16
        }
}

TEST(Bf16Matmul, ProcessPrecisionSwitchesGemm) {
  const int64_t M = 16, N = 24, K = 40;
  auto A = randn(M * K, 4), B = randn(N * K, 5);
  std::vector<float> f32(M * N), sw(M * N), b16(M * N);
  gemm_f32(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, f32.data(), N);
  const PrecisionReport r = apply_training_precision("bf16");
  gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, sw.data(), N);
  if (r.used == "bf16") {
    gemm_bf16(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, b16.data(), N);
    EXPECT_EQ(sw, b16);
    EXPECT_NE(sw, f32);
    EXPECT_GT(r.bf16_gflops, 0);
    EXPECT_GT(r.fp32_gflops, 0);
  } else {
    EXPECT_EQ(sw, f32);
  }
  apply_training_precision("fp32");
  gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, sw.data(), N);
  EXPECT_EQ(sw, f32);
  EXPECT_THROW(apply_training_precision("fp16"), Error);
}
