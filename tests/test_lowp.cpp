// Low-precision inference weights (ops/lowp_linear.h): conversions, fast kernels against the
// reference on the same dequantised weights, and the error of bf16 / int8 weights against fp32.
// The int8 cases run under every int8 kernel set the host has (ops/q8_gemm.h: vnni, avx2, fallback).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "op_test_util.h"
#include "ops/linear.h"
#include "ops/lowp_gemm.h"
#include "ops/lowp_linear.h"
#include "ops/q8_gemm.h"

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
  WeightMatrix w{Dtype::int8, q.data(), s.data(), R, C};
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
  WeightMatrix view(Dtype t) const {
    if (t == Dtype::f32) return {t, f32.data(), nullptr, R, C};
    if (t == Dtype::bf16) return {t, bf16.data(), nullptr, R, C};
    return {t, q.data(), scale.data(), R, C};
  }
};

// The int8 kernels this host can run: on an AVX-512 VNNI host all three (vnni, avx2, fallback), so
// CI checks every path there.
static std::vector<Q8Kernels> q8_kernel_sets() {
  std::vector<Q8Kernels> ks;
  for (Q8Kernels k : {Q8Kernels::vnni, Q8Kernels::avx2, Q8Kernels::fallback})
    if (q8_kernels_available(k)) ks.push_back(k);
  return ks;
}

// The int8 kernels set to k for a scope, the process's own restored after it.
struct ScopedQ8Kernels {
  Q8Kernels keep = q8_kernels();
  explicit ScopedQ8Kernels(Q8Kernels k) { set_q8_kernels(k); }
  ~ScopedQ8Kernels() { set_q8_kernels(keep); }
};

// One case of the linear tests: a dtype, and for int8 the kernels it runs under.
struct LowpPath {
  Dtype t;
  Q8Kernels k;
  std::string name() const { return std::string(dtype_name(t)) + (t == Dtype::int8 ? std::string(" ") + q8_kernels_name(k) : ""); }
};
static std::vector<LowpPath> lowp_paths() {
  std::vector<LowpPath> ps = {{Dtype::f32, q8_kernels()}, {Dtype::bf16, q8_kernels()}};
  for (Q8Kernels k : q8_kernel_sets()) ps.push_back({Dtype::int8, k});
  return ps;
}

// int8 products quantise their input per block of 32 (quantize_act_q8): the vector path gives the
// very bits of quantize_int8_span on each block (a short last block, an all-zero block, ties).
TEST(Int8, ActivationBlocksQuantiseAsTheSpanQuantiser) {
  for (int64_t n : {32, 64, 96, 100, 7, 768}) {
    auto x = randn(n, 30 + n, 2.0f);
    for (int64_t c = 0; c < std::min<int64_t>(n, 32); ++c) x[c] = n == 64 ? 0.0f : x[c];  // n 64: block 0 all zero
    if (n >= 32 && n != 64) x[5] = 63.5f, x[6] = 127.0f, x[7] = -31.5f;  // scale 1: exact ties, rounded to even
    std::vector<int8_t> q(n), qr(n);
    std::vector<float> s((n + 31) / 32), sr(s.size());
    quantize_act_q8(q.data(), s.data(), x.data(), n);
    for (int64_t b = 0; b * 32 < n; ++b) sr[b] = quantize_int8_span(qr.data() + b * 32, x.data() + b * 32, std::min<int64_t>(32, n - b * 32));
    EXPECT_EQ(q, qr) << n;
    EXPECT_EQ(s, sr) << n;
    if (n >= 32 && n != 64) {
      EXPECT_EQ(s[0], 1.0f);
      EXPECT_EQ(q[5], 64);   // 63.5 -> even
      EXPECT_EQ(q[7], -32);  // -31.5 -> even
    }
    if (n == 64) {
      EXPECT_EQ(s[0], 0.0f);
    }
  }
}

// Fast paths (register tiles: f32, bf16 converted in registers, int8 x int8 by vpdpbusd; sgemm on
// converted panels) against the double-accumulating reference on the same dequantised weights (and,
// for int8, the same quantised input): only fp32 summation order differs. C 768 and 64 take the
// int8 vector tile, 96 (blocks of 32, not of 64) and 40 / 48 (a short block) the portable one.
// Many rows (past lowp_gemv_max_rows) run the bf16 / int8 products of ops/lowp_gemm.h where the CPU
// has them: the reference then rounds the input as they do (bf16; int8 per block of 32, as the
// per-row kernels), and the int8 sums are exact int32 either way, so the same 2e-5 holds. int8 runs
// under each kernel set of the host (vnni, avx2: switch at 8 rows; fallback: 16, then panels + sgemm).
TEST(LowpLinear, FastMatchesReference) {
  for (const LowpPath& p : lowp_paths()) {
    ScopedQ8Kernels ks(p.k);
    for (int64_t C : {48, 40, 96, 64, 768})
      for (int64_t OC : {5, 37, 300})
        for (int64_t N : {1, 3, 8, 9, 11, 16, 17, 24, 25, 48, 49, 70}) {  // both sides of each switch
          Weights3 w(OC, C, 100 + C + OC);
          auto x = randn(N * C, 13 + N);
          for (bool acc : {false, true}) {
            std::vector<float> y(N * OC, 0.5f), yr(N * OC, 0.5f);
            linear_forward_lowp(y.data(), x.data(), w.view(p.t), N, acc);
            linear_forward_lowp_ref(yr.data(), x.data(), w.view(p.t), N, acc, RowKernel::fastest);
            EXPECT_LT(rel_err(y, yr), 2e-5) << p.name() << " N " << N << " C " << C << " OC " << OC << " acc " << acc;
          }
        }
  }
}

// RowKernel::per_row (decoding): each output row has the bits it gets alone (N = 1), whatever N, for
// every dtype: full 4-row blocks and the last rows, C a multiple of 16 / 64 (the vector tiles) or not.
// The fastest kernels do not promise it (f32: the tile up to 4 rows, sgemm beyond).
TEST(LowpLinear, PerRowKernelGivesEachRowItsBitsAloneWhateverN) {
  for (const LowpPath& p : lowp_paths()) {
    ScopedQ8Kernels ks(p.k);
    for (int64_t C : {32, 40, 64, 96})
      for (int64_t OC : {3, 37, 211}) {
        Weights3 w(OC, C, 7 + C + OC);
        const int64_t Nmax = 40;
        auto x = randn(Nmax * C, 19 + C);
        std::vector<float> alone(Nmax * OC);
        for (int64_t n = 0; n < Nmax; ++n)
          linear_forward_lowp(alone.data() + n * OC, x.data() + n * C, w.view(p.t), 1, false, RowKernel::per_row);
        for (int64_t N : {2, 4, 5, 8, 16, 17, 33, 40}) {
          std::vector<float> y(N * OC);
          linear_forward_lowp(y.data(), x.data(), w.view(p.t), N, false, RowKernel::per_row);
          EXPECT_EQ(std::memcmp(y.data(), alone.data(), y.size() * sizeof(float)), 0)
              << p.name() << " N " << N << " C " << C << " OC " << OC;
        }
      }
  }
}

// Several matrices of one input in one call give the bits of one call each (int8: one quantised input).
TEST(LowpLinear, MultiEqualsOneCallEach) {
  const int64_t C = 768;
  Weights3 a(300, C, 40), b(64, C, 41), c(37, C, 42);
  for (const LowpPath& p : lowp_paths()) {
    ScopedQ8Kernels ks(p.k);
    const Dtype t = p.t;
    for (int64_t N : {1, 3, 16, 20}) {
      auto x = randn(N * C, 43 + N);
      std::vector<float> ya(N * 300, 1.0f), yb(N * 64, 1.0f), yc(N * 37, 1.0f);
      auto ya1 = ya, yb1 = yb, yc1 = yc;
      const LinearOut outs[3] = {{ya.data(), a.view(t)}, {yb.data(), b.view(t), true}, {yc.data(), c.view(t)}};
      linear_forward_lowp_multi(outs, 3, x.data(), N);
      linear_forward_lowp(ya1.data(), x.data(), a.view(t), N);
      linear_forward_lowp(yb1.data(), x.data(), b.view(t), N, true);
      linear_forward_lowp(yc1.data(), x.data(), c.view(t), N);
      EXPECT_EQ(ya, ya1) << p.name() << " N " << N;
      EXPECT_EQ(yb, yb1) << p.name() << " N " << N;
      EXPECT_EQ(yc, yc1) << p.name() << " N " << N;
    }
  }
  Weights3 d(8, 96, 44);
  auto x = randn(C, 45);
  std::vector<float> y1(300), y2(8);
  const LinearOut bad[2] = {{y1.data(), a.view(Dtype::f32)}, {y2.data(), d.view(Dtype::f32)}};
  EXPECT_THROW(linear_forward_lowp_multi(bad, 2, x.data(), 1), Error);  // the matrices' columns differ
}

// The error that the weights' precision itself brings, against the fp32 product, for weights of
// the scale training gives (normal, std 0.05) and C = 768: bf16 keeps 8 significant bits (relative
// error of a weight <= 2^-9, of a dot product typically ~1e-3); int8 per row: step max|w|/127 with
// max|w| ~ 3.3 std over 768 values, relative RMS error step/sqrt(12)/std ~ 0.8 %; the int8 input
// adds its own (normal input: max|x| over a block of 32 ~ 2.2 std, step/sqrt(12) ~ 0.5 %): ~0.95 %
// together (measured 9.6e-3; 7.8e-3 with fp32 inputs).
TEST(LowpLinear, ErrorAgainstFp32IsBounded) {
  const int64_t N = 8, C = 768, OC = 512;
  Weights3 w(OC, C, 21);
  auto x = randn(N * C, 22);
  std::vector<float> y32(N * OC), y16(N * OC), y8(N * OC);
  linear_forward(y32.data(), x.data(), w.f32.data(), N, C, OC);
  linear_forward_lowp(y16.data(), x.data(), w.view(Dtype::bf16), N);
  linear_forward_lowp(y8.data(), x.data(), w.view(Dtype::int8), N);
  const double e16 = rel_err(y16, y32), e8 = rel_err(y8, y32);
  EXPECT_LT(e16, 3e-3);
  EXPECT_GT(e16, 1e-5);  // it really ran in bf16
  EXPECT_LT(e8, 1.5e-2);
  EXPECT_GT(e8, 1e-4);
  std::printf("relative error against fp32: bf16 %.2e, int8 (weights per row, input per block of 32) %.2e\n", e16, e8);
}

TEST(LowpLinear, ParsesDtypeNames) {
  for (Dtype t : {Dtype::f32, Dtype::bf16, Dtype::int8}) EXPECT_EQ(parse_dtype(dtype_name(t), "--weight-dtype"), t);
  EXPECT_EQ(dtype_bytes(Dtype::f32) + dtype_bytes(Dtype::bf16) + dtype_bytes(Dtype::int8), 7);
  try {
    parse_dtype("q4_0", "--weight-dtype");
    ADD_FAILURE() << "q4_0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--weight-dtype: dtype 'q4_0' is not one of f32, bf16, int8");
  }
}

// The many-row products alone (ops/lowp_gemm.h, where the CPU has them; int8: q8_gemm under each
// kernel set of the host, the plain loops too) against the reference on the input they multiply, at
// shapes past every tile edge: C not a multiple of 32 or 64, OC not of 8 or 32 (the avx2 / vnni
// panels), N leaving every remainder of 4 and of 6 (their tiles' input rows).
TEST(LowpGemm, MatchesReference) {
  struct Case { Dtype t; Q8Kernels k; };
  std::vector<Case> cases;
  if (lowp_gemm_enabled(Dtype::bf16)) cases.push_back({Dtype::bf16, q8_kernels()});
  else std::printf("bf16: no native product on this CPU (%s)\n", lowp_gemm_kernel_name(Dtype::bf16));
  for (Q8Kernels k : q8_kernel_sets()) cases.push_back({Dtype::int8, k});
  for (const Case& cs : cases)
    for (int64_t C : {40, 100, 768})
      for (int64_t OC : {5, 67, 96, 300})
        for (int64_t N : {1, 4, 7, 33, 130})
          for (bool acc : {false, true}) {
            Weights3 w(OC, C, 200 + C + OC);
            const auto x = randn(N * C, 17 + N + C);
            std::vector<float> xr(N * C), y(N * OC, 0.5f), yr(N * OC, 0.5f), W(OC * C);
            lowp_gemm_input_ref(xr.data(), x.data(), cs.t, N, C);
            dequantize_rows(W.data(), w.view(cs.t), 0, OC);
            linear_forward_ref(yr.data(), xr.data(), W.data(), N, C, OC);
            if (acc)
              for (auto& v : yr) v += 0.5f;
            if (cs.t == Dtype::int8) q8_gemm(y.data(), x.data(), w.view(cs.t), N, acc, cs.k);
            else lowp_gemm(y.data(), x.data(), w.view(cs.t), N, acc);
            EXPECT_LT(rel_err(y, yr), 2e-5) << dtype_name(cs.t) << " " << (cs.t == Dtype::int8 ? q8_kernels_name(cs.k) : "")
                                            << " N " << N << " C " << C << " OC " << OC << " acc " << acc;
          }
}

// The avx2 and vnni tiles sum each block exactly in int32 and apply the same fp32 operations in the
// same order (ops/q8_gemm.h): the same bits, at every tile edge, with and without accumulate, for
// weights of -128 too (stored files may hold them; quantize_int8_rows never makes them).
TEST(Q8Gemm, Avx2GivesTheBitsOfVnni) {
  if (!q8_kernels_available(Q8Kernels::vnni) || !q8_kernels_available(Q8Kernels::avx2)) {
    std::printf("skipped: this CPU or build lacks vnni or avx2\n");
    return;
  }
  for (int64_t C : {32, 40, 100, 768})
    for (int64_t OC : {1, 5, 17, 67, 300})
      for (int64_t N : {1, 4, 7, 33, 130}) {
        Weights3 w(OC, C, 300 + C + OC);
        for (int64_t c = 0; c < C; c += 3) w.q[c] = -128;  // row 0
        auto x = randn(N * C, 31 + N + C, 2.0f);
        for (int64_t c = 0; c < std::min<int64_t>(C, 32); ++c) x[c] = 0.0f;  // row 0's first block all zero
        for (bool acc : {false, true}) {
          std::vector<float> yv(N * OC, 0.25f), ya(N * OC, 0.25f);
          q8_gemm(yv.data(), x.data(), w.view(Dtype::int8), N, acc, Q8Kernels::vnni);
          q8_gemm(ya.data(), x.data(), w.view(Dtype::int8), N, acc, Q8Kernels::avx2);
          EXPECT_EQ(std::memcmp(yv.data(), ya.data(), yv.size() * sizeof(float)), 0)
              << "N " << N << " C " << C << " OC " << OC << " acc " << acc << " rel " << rel_err(ya, yv);
        }
      }
}

// The int32 sums at their extremes: every input value +-127 after quantisation (|x| all equal) and
// weights of 127, -128 and +-127 with the input's sign (every product +127 * 127: a vpmaddubsw pair
// of 32,258, or 32,512 with -128, just under its int16 saturation at 32,767). Each kernel set against
// the exact value, computed in double: a saturated pair would lose at least 254 of a block's ~516,000.
TEST(Q8Gemm, ExtremeProductsDoNotSaturate) {
  const int64_t N = 3, C = 96, OC = 5;
  std::vector<float> x(N * C);
  for (int64_t i = 0; i < N * C; ++i) x[i] = (i % 3 == 0 ? -1.0f : 1.0f) * static_cast<float>(1 + i / C);
  std::vector<int8_t> q(OC * C);
  std::vector<float> scale = {1.0f, 0.5f, 2.0f, 1.0f, 0.25f};
  for (int64_t c = 0; c < C; ++c) {
    const bool neg = c % 3 == 0;  // x's sign in every row
    q[0 * C + c] = 127;
    q[1 * C + c] = -128;
    q[2 * C + c] = neg ? -127 : 127;
    q[3 * C + c] = neg ? -128 : 127;
    q[4 * C + c] = neg ? 127 : -127;
  }
  const WeightMatrix w{Dtype::int8, q.data(), scale.data(), OC, C};
  for (Q8Kernels k : q8_kernel_sets()) {
    std::vector<float> y(N * OC);
    q8_gemm(y.data(), x.data(), w, N, false, k);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < OC; ++o) {
        double sum = 0;  // every block's scale is (1 + n) / 127 and every quantised value +-127
        for (int64_t c = 0; c < C; ++c) sum += (c % 3 == 0 ? -127.0 : 127.0) * q[o * C + c];
        const double want = sum * (1 + n) / 127.0 * scale[o];
        EXPECT_NEAR(y[n * OC + o], want, 1e-6 * std::fabs(want)) << q8_kernels_name(k) << " n " << n << " o " << o;
      }
  }
}

// The kernels named on the start-up line, and JTOK_LOWP_KERNELS's values checked.
TEST(Q8Gemm, KernelSetsAreNamedAndChecked) {
  for (Q8Kernels k : q8_kernel_sets()) {
    ScopedQ8Kernels ks(k);
    EXPECT_EQ(q8_kernels(), k);
    EXPECT_EQ(parse_q8_kernels(q8_kernels_name(k), "JTOK_LOWP_KERNELS"), k);
    const std::string line = lowp_kernels_line(Dtype::int8, 768);
    const char* want = k == Q8Kernels::vnni   ? "more rows int8 x int8 tiles, input per block of 32 (avx512_vnni vpdpbusd)"
                       : k == Q8Kernels::avx2 ? "more rows int8 x int8 tiles, input per block of 32 (avx2 vpmaddubsw)"
                                              : "more rows fp32 panels + sgemm";
    EXPECT_NE(line.find(want), std::string::npos) << line;
    EXPECT_EQ(line.find(k == Q8Kernels::vnni ? "portable" : "vpdpbusd"), std::string::npos) << line;
  }
  try {
    parse_q8_kernels("avx512", "JTOK_LOWP_KERNELS");
    ADD_FAILURE() << "avx512 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("JTOK_LOWP_KERNELS=avx512: not one of vnni, avx2, fallback"), std::string::npos) << e.what();
  }
  for (Q8Kernels k : {Q8Kernels::vnni, Q8Kernels::avx2})
    if (!q8_kernels_available(k)) {
      EXPECT_THROW(parse_q8_kernels(q8_kernels_name(k), "JTOK_LOWP_KERNELS"), Error);
      EXPECT_THROW(set_q8_kernels(k), Error);
    }
}

// Activations shaped like a model's: an RMSNorm output (normal, a few channels with 8x the gain),
// and a SwiGLU output (silu(a) * b: heavy-tailed), the down projection's input. The int8 product's
// error against fp32: lowp_gemm and the per-row kernels quantise the input per block of 32 (so their
// errors agree to fp32 summation order), against one scale per row (what a library int8 GEMM
// offers; computed here by the reference). Measured (C 768 / 3072, OC 512, 64 rows): normal 9.2e-3
// (block) / 1.08e-2 (row); outlier channels 1.04e-2 / 2.42e-2; SwiGLU 1.22e-2 / 2.54e-2: one scale
// per row costs up to ~2x the error where a row's largest values stand out. The bounds are ~1.6x
// the per-block figures; a wrong scale or a lost block would give errors of order 1.
TEST(LowpGemm, Int8ErrorAgainstFp32) {
  // lowp_gemm runs on any CPU (without VNNI, plain loops), so the error is measured everywhere.
  const int64_t N = 64, OC = 512;
  struct Case { const char* name; int64_t C; double max_err; } cases[] = {
      {"normal", 768, 1.5e-2}, {"outlier channels", 768, 1.7e-2}, {"swiglu", 3072, 2e-2}};
  for (const auto& k : cases) {
    const int64_t C = k.C;
    Weights3 w(OC, C, 31);
    auto x = randn(N * C, 32);
    if (std::string(k.name) == "outlier channels")
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c : {3, 200, 501}) x[n * C + c] *= 8.0f;
    if (std::string(k.name) == "swiglu") {
      const auto b = randn(N * C, 33);
      for (int64_t i = 0; i < N * C; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i])) * b[i];
    }
    std::vector<float> y32(N * OC), yb(N * OC), yg(N * OC), yrow(N * OC), xrow(N * C), W(OC * C);
    linear_forward(y32.data(), x.data(), w.f32.data(), N, C, OC);
    linear_forward_lowp(yb.data(), x.data(), w.view(Dtype::int8), N, false, RowKernel::per_row);
    lowp_gemm(yg.data(), x.data(), w.view(Dtype::int8), N, false);
    std::vector<int8_t> q(C);
    for (int64_t n = 0; n < N; ++n) {  // one scale per input row
      const float s = quantize_int8_span(q.data(), x.data() + n * C, C);
      for (int64_t c = 0; c < C; ++c) xrow[n * C + c] = q[c] * s;
    }
    dequantize_rows(W.data(), w.view(Dtype::int8), 0, OC);
    linear_forward_ref(yrow.data(), xrow.data(), W.data(), N, C, OC);
    const double eb = rel_err(yb, y32), eg = rel_err(yg, y32), er = rel_err(yrow, y32);
    std::printf("int8 %-16s C %4ld: relative error against fp32, input per block of 32: lowp_gemm %.2e, per-row "
                "kernels %.2e; input per row %.2e\n", k.name, static_cast<long>(C), eg, eb, er);
    EXPECT_LT(eg, k.max_err) << k.name;
    EXPECT_GT(eg, 1e-4) << k.name;
    EXPECT_NEAR(eg, eb, 1e-2 * eb) << k.name;  // the same quantised input
    EXPECT_LT(eg, er) << k.name;                // per block beats per row
  }
}
