// Low-precision inference weights (ops/lowp_linear.h): conversions, fast kernels against the
// reference on the same dequantised weights, and the error of bf16 / int8 weights against fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "op_test_util.h"
#include "ops/linear.h"
#include "ops/lowp_linear.h"

using namespace jtok;
using namespace jtok::testing;

static float bits_to_f32(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 lies half way between bf16 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 0x1p-8f)), 1.0f);
  // 1 + 3 * 2^-8 lies half way between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);  // above the tie: up
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bits_to_f32(0x7f800001u)))));  // a NaN that would round to inf
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(INFINITY)), INFINITY);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-0.0f)), 0.0f);
  // Every value: the nearest of its two bf16 neighbours, so within half a unit (2^-8 relative).
  for (float x : randn(1000, 11, 3.0f)) {
    const float r = bf16_to_f32(f32_to_bf16(x));
    EXPECT_LE(std::fabs(r - x), std::ldexp(std::fabs(x), -8)) << x;
  }
}

TEST(Int8, PerRowQuantisation) {
  const int64_t R = 7, C = 33;
  auto W = randn(R * C, 12);
  for (int64_t c = 0; c < C; ++c) W[3 * C + c] = 0.0f;  // an all-zero row
  std::vector<int8_t> q(R * C);
  std::vector<float> s(R), back(R * C);
  quantize_int8_rows(q.data(), s.data(), W.data(), R, C);
  WeightMatrix w{WeightDType::int8, q.data(), s.data(), R, C};
  dequantize_rows(back.data(), w, 0, R);
  for (int64_t o = 0; o < R; ++o) {
    int maxq = 0;
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_LE(std::fabs(back[o * C + c] - W[o * C + c]), 0.5f * s[o] * (1 + 1e-6f)) << o << "," << c;
      maxq = std::max(maxq, std::abs(static_cast<int>(q[o * C + c])));
    }
    EXPECT_EQ(maxq, o == 3 ? 0 : 127);  // the largest magnitude maps to +-127
  }
  EXPECT_EQ(s[3], 0.0f);
  W[5] = NAN;
  EXPECT_THROW(quantize_int8_rows(q.data(), s.data(), W.data(), R, C), Error);
}

// One weight matrix in all three dtypes.
struct Weights3 {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<int8_t> q;
  std::vector<float> scale;
  int64_t R, C;
  Weights3(int64_t R_, int64_t C_, uint64_t seed) : f32(randn(R_ * C_, seed, 0.05f)), bf16(R_ * C_), q(R_ * C_), scale(R_), R(R_), C(C_) {
    quantize_bf16(bf16.data(), f32.data(), R * C);
    quantize_int8_rows(q.data(), scale.data(), f32.data(), R, C);
  }
  WeightMatrix view(WeightDType t) const {
    if (t == WeightDType::f32) return {t, f32.data(), nullptr, R, C};
    if (t == WeightDType::bf16) return {t, bf16.data(), nullptr, R, C};
    return {t, q.data(), scale.data(), R, C};
  }
};

// Fast paths (gemv with and without the register conversion, sgemm on converted panels) against
// the double-accumulating reference on the same dequantised weights: only fp32 summation order differs.
TEST(LowpLinear, FastMatchesReference) {
  for (int64_t C : {48, 40, 768})
    for (int64_t OC : {5, 37, 300})
      for (int64_t N : {1, 3, 16, 17, 70}) {
        Weights3 w(OC, C, 100 + C + OC);
        auto x = randn(N * C, 13 + N);
        for (auto t : {WeightDType::f32, WeightDType::bf16, WeightDType::int8})
          for (bool acc : {false, true}) {
            std::vector<float> y(N * OC, 0.5f), yr(N * OC, 0.5f);
            linear_forward_lowp(y.data(), x.data(), w.view(t), N, acc);
            linear_forward_lowp_ref(yr.data(), x.data(), w.view(t), N, acc);
            EXPECT_LT(rel_err(y, yr), 2e-5) << weight_dtype_name(t) << " N " << N << " C " << C << " OC " << OC << " acc " << acc;
          }
      }
}

// The error that the weights' precision itself brings, against the fp32 product, for weights of
// the scale training gives (normal, std 0.05) and C = 768: bf16 keeps 8 significant bits (relative
// error of a weight <= 2^-9, of a dot product typically ~1e-3); int8 per row: step max|w|/127 with
// max|w| ~ 3.3 std over 768 values, relative RMS error step/sqrt(12)/std ~ 0.8 %.
TEST(LowpLinear, ErrorAgainstFp32IsBounded) {
  const int64_t N = 8, C = 768, OC = 512;
  Weights3 w(OC, C, 21);
  auto x = randn(N * C, 22);
  std::vector<float> y32(N * OC), y16(N * OC), y8(N * OC);
  linear_forward(y32.data(), x.data(), w.f32.data(), N, C, OC);
  linear_forward_lowp(y16.data(), x.data(), w.view(WeightDType::bf16), N);
  linear_forward_lowp(y8.data(), x.data(), w.view(WeightDType::int8), N);
  const double e16 = rel_err(y16, y32), e8 = rel_err(y8, y32);
  EXPECT_LT(e16, 3e-3);
  EXPECT_GT(e16, 1e-5);  // it really ran in bf16
  EXPECT_LT(e8, 1.5e-2);
  EXPECT_GT(e8, 1e-4);
  std::printf("relative error against fp32: bf16 %.2e, int8 per row %.2e\n", e16, e8);
}

TEST(LowpLinear, ParsesDtypeNames) {
  EXPECT_EQ(parse_weight_dtype("int8"), WeightDType::int8);
  EXPECT_EQ(parse_weight_dtype("bf16"), WeightDType::bf16);
  EXPECT_EQ(parse_weight_dtype("f32"), WeightDType::f32);
  EXPECT_THROW(parse_weight_dtype("q4_0"), Error);
}
