// Mixed-precision attention (ops/attention_bf16.cpp) and its pair products (ops/bf16_pairs.h):
// the tiles against the plain reference across every tile and tail size and both A layouts, the
// packers against f32_to_bf16, and the attention against the double reference within the error
// bf16 operands allow, for shapes that cross the row and key block edges.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "error_test_util.h"
#include "op_test_util.h"
#include "ops/attention.h"
#include "ops/bf16_pairs.h"
#include "ops/linear.h"
#include "ops/lowp_convert.h"

using namespace jtok;
using namespace jtok::testing;

namespace {

std::vector<uint32_t> random_pairs(size_t n, uint64_t seed) {
  const std::vector<float> x = randn(2 * n, seed);
  std::vector<uint32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = f32_to_bf16(x[2 * i]) | (static_cast<uint32_t>(f32_to_bf16(x[2 * i + 1])) << 16);
  return p;
}

double pair_abs(uint32_t a, uint32_t b) {
  return std::fabs(static_cast<double>(bf16_to_f32(a & 0xFFFF)) * bf16_to_f32(b & 0xFFFF)) +
         std::fabs(static_cast<double>(bf16_to_f32(a >> 16)) * bf16_to_f32(b >> 16));
}

}  // namespace

// Rows 1..13 (tiles of 6 and their tails), columns up to 130 (panels of 64, vectors of 16, masked
// tails), 1..33 pairs, A as rows of pairs or read transposed, with and without accumulation.
TEST(Bf16Pairs, TilesMatchTheReferenceForEveryTileAndTail) {
  int checked = 0;
  for (int64_t M : {1, 5, 6, 7, 13})
    for (int64_t N : {1, 15, 16, 17, 64, 65, 130})
      for (int64_t Pn : {1, 3, 32, 33})
        for (bool transposed : {false, true})
          for (float beta : {0.0f, 1.0f}) {
            const int64_t a_row = transposed ? 1 : Pn + 2, a_pair = transposed ? M + 3 : 1, ldb = N + 5, ldc = N + 7;
            const auto A = random_pairs(static_cast<size_t>(std::max(M * a_row, Pn * a_pair) + M + Pn), M * 7 + N);
            const auto B = random_pairs(static_cast<size_t>(Pn * ldb), N * 11 + Pn);
            const std::vector<float> C0 = randn(static_cast<size_t>(M * ldc), 5);
            std::vector<float> C = C0, R = C0;
            gemm_bf16_pairs(M, N, Pn, 0.75f, A.data(), a_row, a_pair, B.data(), ldb, beta, C.data(), ldc);
            gemm_bf16_pairs_ref(M, N, Pn, 0.75f, A.data(), a_row, a_pair, B.data(), ldb, beta, R.data(), ldc);
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < ldc; ++n) {
                if (n >= N) {  // past the product's columns: untouched
                  ASSERT_EQ(C[m * ldc + n], C0[m * ldc + n]);
                  continue;
                }
                double bound = std::fabs(C0[m * ldc + n]) * beta;
                for (int64_t p = 0; p < Pn; ++p) bound += pair_abs(A[m * a_row + p * a_pair], B[p * ldb + n]);
                // bf16 x bf16 products are exact in fp32; only the fp32 sums' order and rounding differ.
                ASSERT_NEAR(C[m * ldc + n], R[m * ldc + n], 4e-7 * (2 * Pn + 2) * bound + 1e-30)
                    << "M=" << M << " N=" << N << " Pn=" << Pn << " transposed=" << transposed << " beta=" << beta;
                ++checked;
              }
          }
  EXPECT_GT(checked, 10000);
}

// The packers give f32_to_bf16's rounding, pairs in the documented order, zero for a missing half.
TEST(Bf16Pairs, PackersRoundAsF32ToBf16) {
  auto pair = [](float lo, float hi) {
    return static_cast<uint32_t>(f32_to_bf16(lo)) | (static_cast<uint32_t>(f32_to_bf16(hi)) << 16);
  };
  for (int64_t rows : {1, 2, 5})
    for (int64_t cols : {1, 17, 33, 40, 600}) {
      const int64_t ld = cols + 3, pc = (cols + 1) / 2, pr = (rows + 1) / 2;
      const std::vector<float> x = randn(static_cast<size_t>(rows * ld), rows * 100 + cols);
      auto at = [&](int64_t r, int64_t c) { return r < rows && c < cols ? x[r * ld + c] : 0.0f; };
      std::vector<uint32_t> along(rows * pc), inter(pr * (cols + 1)), trans(pc * (rows + 2));
      pack_pairs_along_rows(along.data(), x.data(), rows, cols, ld);
      pack_row_pairs(inter.data(), cols + 1, x.data(), rows, cols, ld);
      pack_transposed_pairs(trans.data(), rows + 2, x.data(), rows, cols, ld);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t p = 0; p < pc; ++p) {
          ASSERT_EQ(along[r * pc + p], pair(at(r, 2 * p), at(r, 2 * p + 1))) << rows << "x" << cols;
          ASSERT_EQ(trans[p * (rows + 2) + r], pair(at(r, 2 * p), at(r, 2 * p + 1))) << rows << "x" << cols;
        }
      for (int64_t p = 0; p < pr; ++p)
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(inter[p * (cols + 1) + c], pair(at(2 * p, c), at(2 * p + 1, c))) << rows << "x" << cols;
    }
}

struct Bf16AttnCase { int64_t B, T, H, KV, hd; };
void PrintTo(const Bf16AttnCase& c, std::ostream* os) {
  *os << "B=" << c.B << " T=" << c.T << " H=" << c.H << " KV=" << c.KV << " hd=" << c.hd;
}
class AttentionBf16 : public ::testing::TestWithParam<Bf16AttnCase> {};

// Forward and backward against the double reference. bf16 keeps 8 bits of each operand, so the
// error is ~2^-9 per rounding, a few roundings deep: the bounds are about 3x the largest measured
// (y 3.3e-3, lse 2.1e-3, dq 2.4e-3, dk 6.2e-3, dv 3.5e-3 over these shapes).
TEST_P(AttentionBf16, MatchesTheReferenceWithinBf16sError) {
  auto [B, T, H, KV, hd] = GetParam();
  const size_t nq = B * T * H * hd, nk = B * T * KV * hd;
  auto q = randn(nq, 41), k = randn(nk, 42), v = randn(nk, 43), dy = randn(nq, 44);
  std::vector<float> y(nq, NAN), lse(B * H * T, NAN), yr(nq), P(B * H * T * T), lser(B * H * T);
  attention_forward_bf16(y.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
  attention_forward_ref(yr.data(), P.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd, lser.data());
  EXPECT_LT(rel_err(y, yr), 1e-2);
  EXPECT_LT(rel_err(lse, lser), 6e-3);
  // Gradients accumulate into non-zero starts, as the fp32 kernel's.
  std::vector<float> dq(nq, 0.5f), dk(nk, -0.25f), dv(nk, 0.125f), dqr = dq, dkr = dk, dvr = dv;
  attention_backward_bf16(dq.data(), dk.data(), dv.data(), dy.data(), y.data(), lse.data(), q.data(), k.data(),
                          v.data(), B, T, H, KV, hd);
  attention_backward_ref(dqr.data(), dkr.data(), dvr.data(), dy.data(), P.data(), q.data(), k.data(), v.data(), B, T,
                         H, KV, hd);
  EXPECT_LT(rel_err(dq, dqr), 1e-2);
  EXPECT_LT(rel_err(dk, dkr), 2e-2);
  EXPECT_LT(rel_err(dv, dvr), 1e-2);
  // The same bits on one thread as on two (each thread owns whole heads and groups).
  const int threads = omp_get_max_threads();
  omp_set_num_threads(threads == 1 ? 2 : 1);
  std::vector<float> y1(nq), lse1(lse.size()), dq1(nq, 0.5f), dk1(nk, -0.25f), dv1(nk, 0.125f);
  attention_forward_bf16(y1.data(), lse1.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
  attention_backward_bf16(dq1.data(), dk1.data(), dv1.data(), dy.data(), y1.data(), lse1.data(), q.data(), k.data(),
                          v.data(), B, T, H, KV, hd);
  omp_set_num_threads(threads);
  EXPECT_EQ(y1, y);
  EXPECT_EQ(dq1, dq);
  EXPECT_EQ(dk1, dk);
  EXPECT_EQ(dv1, dv);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionBf16,
                         ::testing::Values(Bf16AttnCase{2, 1, 4, 2, 8}, Bf16AttnCase{1, 63, 3, 3, 16},
                                           Bf16AttnCase{2, kAttnRowBlock, 2, 1, 8},
                                           Bf16AttnCase{2, 2 * kAttnRowBlock + 5, 4, 2, 6},  // odd rows, hd/2 odd
                                           Bf16AttnCase{1, kAttnRowBlock + 1, 3, 3, 16},
                                           Bf16AttnCase{1, 200, 4, 1, 64},
                                           Bf16AttnCase{1, kAttnKeyBlock - 1, 2, 2, 8},
                                           Bf16AttnCase{1, kAttnKeyBlock + 1, 4, 2, 8},  // a key block of one key
                                           Bf16AttnCase{1, 1000, 2, 1, 64}));            // two key blocks, GQA

// attention_forward / _backward run the bf16 kernels exactly when the matmul precision is bf16.
// Without AVX-512 BF16 the precision cannot be set (an error naming it) and the kernels stay fp32.
TEST(AttentionBf16Dispatch, TheDefaultKernelsFollowTheMatmulPrecision) {
  const int64_t B = 1, T = 130, H = 2, KV = 1, hd = 16;
  auto q = randn(B * T * H * hd, 51), k = randn(B * T * KV * hd, 52), v = randn(B * T * KV * hd, 53);
  std::vector<float> yb(q.size()), yd(q.size()), yf(q.size()), lse(B * H * T);
  attention_forward_bf16(yb.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
  attention_forward(yf.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
  EXPECT_NE(yf, yb);
  if (!bf16_matmul_supported()) {
    expect_error([] { set_matmul_precision(MatmulPrecision::bf16); }, {"bf16 matmul needs AVX-512 BF16"});
    yb = yf;  // what the default kernels must still give
  } else {
    set_matmul_precision(MatmulPrecision::bf16);
  }
  attention_forward(yd.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
  set_matmul_precision(MatmulPrecision::fp32);
  EXPECT_EQ(yd, yb);
}
