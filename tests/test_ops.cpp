// Every fast op against its reference, and every reference backward against finite differences.
#include <gtest/gtest.h>

#include <ostream>

#include <omp.h>

#include "op_test_util.h"
#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/lowp_linear.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

using namespace jtok;
using namespace jtok::testing;

// Fast vs reference: fp32 against a double-accumulating reference.
constexpr double kFastTol = 2e-5;
// Finite differences in fp32 inputs with h = 1e-2 on double-accumulating references.
constexpr double kFdTol = 2e-3;

TEST(Linear, FastMatchesReference) {
  const int64_t N = 37, C = 48, OC = 29;
  auto x = randn(N * C, 1), w = randn(OC * C, 2), dy = randn(N * OC, 3);
  std::vector<float> y(N * OC), yr(N * OC);
  linear_forward(y.data(), x.data(), w.data(), N, C, OC);
  linear_forward_ref(yr.data(), x.data(), w.data(), N, C, OC);
  EXPECT_LT(rel_err(y, yr), kFastTol);
  std::vector<float> dx(N * C, 0.5f), dxr(N * C, 0.5f), dw(OC * C, 0.25f), dwr(OC * C, 0.25f);
  linear_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), N, C, OC);
  linear_backward_ref(dxr.data(), dwr.data(), dy.data(), x.data(), w.data(), N, C, OC);
  EXPECT_LT(rel_err(dx, dxr), kFastTol);  // accumulates onto 0.5
  EXPECT_LT(rel_err(dw, dwr), kFastTol);
}

TEST(Linear, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t N = 5, C = 6, OC = 4;
  auto x = randn(N * C, 4), w = randn(OC * C, 5), probe = randn(N * OC, 6);
  std::vector<float> y(N * OC);
  auto f = [&] { linear_forward_ref(y.data(), x.data(), w.data(), N, C, OC); return dot(y, probe); };
  std::vector<float> dx(N * C, 0.0f), dw(OC * C, 0.0f);
  linear_backward_ref(dx.data(), dw.data(), probe.data(), x.data(), w.data(), N, C, OC);
  EXPECT_LT(rel_err(dx, numeric_grad(x, f)), kFdTol);
  EXPECT_LT(rel_err(dw, numeric_grad(w, f)), kFdTol);
}

TEST(RMSNorm, FastMatchesReferenceAndFiniteDifferences) {
  const int64_t N = 9, C = 40;
  auto x = randn(N * C, 7), w = randn(C, 8), dy = randn(N * C, 9);
  std::vector<float> y(N * C), yr(N * C), r(N), rr(N);
  rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), N, C, 1e-6f);
  rmsnorm_forward_ref(yr.data(), rr.data(), x.data(), w.data(), N, C, 1e-6f);
  EXPECT_LT(rel_err(y, yr), kFastTol);
  std::vector<float> dx(N * C, 0.f), dxr(N * C, 0.f), dw(C, 0.f), dwr(C, 0.f);
  rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), r.data(), N, C);
  rmsnorm_backward_ref(dxr.data(), dwr.data(), dy.data(), x.data(), w.data(), rr.data(), N, C);
  EXPECT_LT(rel_err(dx, dxr), kFastTol);
  EXPECT_LT(rel_err(dw, dwr), kFastTol);
  auto f = [&] { rmsnorm_forward_ref(yr.data(), rr.data(), x.data(), w.data(), N, C, 1e-6f); return dot(yr, dy); };
  EXPECT_LT(rel_err(dxr, numeric_grad(x, f)), kFdTol);
  EXPECT_LT(rel_err(dwr, numeric_grad(w, f)), kFdTol);
}

TEST(RoPE, FastMatchesReferenceAndBackwardIsTranspose) {
  const int64_t B = 2, T = 7, H = 3, hd = 8;
  auto x = randn(B * T * H * hd, 10);
  auto xf = x, xr = x;
  auto tab = make_rope_table(T, hd, 10000.0);
  rope_forward(xf.data(), tab, B, T, H, hd);
  rope_forward_ref(xr.data(), B, T, H, hd, 10000.0);
  EXPECT_LT(rel_err(xf, xr), kFastTol);
  // Position 0 is the identity; later positions are not.
  for (int64_t i = 0; i < H * hd; ++i) EXPECT_FLOAT_EQ(xf[i], x[i]);
  EXPECT_GT(rel_err(xf, x), 1e-2);
  // Backward: gradient of sum(rope(x) * probe) by finite differences.
  auto probe = randn(x.size(), 11);
  auto d = probe, dr = probe;
  rope_backward(d.data(), tab, B, T, H, hd);
  rope_backward_ref(dr.data(), B, T, H, hd, 10000.0);
  EXPECT_LT(rel_err(d, dr), kFastTol);
  auto f = [&] { auto y = x; rope_forward_ref(y.data(), B, T, H, hd, 10000.0); return dot(y, probe); };
  EXPECT_LT(rel_err(dr, numeric_grad(x, f)), kFdTol);
}

// Llama 3's scaling: frequencies of wavelengths past original / low_freq_factor divided by the
// factor, those under original / high_freq_factor kept, the band between strictly between the two;
// the scaled table rotates as the plain reference does with those frequencies.
TEST(RoPE, Llama3ScalingBandsAndTable) {
  const int64_t T = 9, H = 2, hd = 16;
  const RopeScaling s{8.0, 1.0, 4.0, 32};  // bands: wavelength < 8 kept, > 32 divided
  const std::vector<float> plain = rope_inv_freq(hd, 10000.0), scaled = rope_inv_freq(hd, 10000.0, &s);
  int kept = 0, divided = 0, blended = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double wavelen = 2 * M_PI / plain[i];
    if (wavelen < 32.0 / 4.0) kept += scaled[i] == plain[i];
    else if (wavelen > 32.0) divided += std::abs(scaled[i] - plain[i] / 8.0f) <= 1e-7f * plain[i];
    else blended += scaled[i] < plain[i] && scaled[i] > plain[i] / 8.0f;
  }
  EXPECT_EQ(kept, 1);     // wavelength 6.3 (i = 0)
  EXPECT_EQ(blended, 1);  // wavelength 19.9 (i = 1); i >= 2 (62.8 and up) divided
  EXPECT_EQ(kept + divided + blended, static_cast<int>(plain.size()));
  auto x = randn(T * H * hd, 12);
  auto xf = x, xr = x;
  rope_forward(xf.data(), make_rope_table(T, hd, 10000.0, &s), 1, T, H, hd);
  rope_forward_ref(xr.data(), 1, T, H, hd, scaled);
  EXPECT_LT(rel_err(xf, xr), kFastTol);
}

struct AttnCase { int64_t B, T, H, KV, hd; };
// Test names show the case, not its raw bytes.
void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << "B=" << c.B << " T=" << c.T << " H=" << c.H << " KV=" << c.KV << " hd=" << c.hd;
}
class Attention : public ::testing::TestWithParam<AttnCase> {};

// One attention forward and backward: output y, probabilities P (the probs kernels and the
// reference) or row log-sum-exp lse (the O(T) kernels), gradients dq, dk, dv.
struct AttnRun { std::vector<float> y, P, lse, dq, dk, dv; };

// The O(T) attention (the default), the probs kernels it replaced, and the reference, from the
// same q, k, v, dy and the same starting buffers (`start`: the forwards must overwrite P / lse, the
// backwards accumulate into dq, dk, dv); checks that each fast kernel's y, P / lse and gradients
// agree with the reference within kFastTol. Returns {O(T), probs kernels, reference}.
struct AttnRuns { AttnRun flash, probs, ref; };
static AttnRuns fast_and_reference(const AttnCase& c, const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v, const std::vector<float>& dy, const AttnRun& start) {
  auto [B, T, H, KV, hd] = c;
  AttnRuns r{start, start, start};
  for (AttnRun* x : {&r.flash, &r.probs, &r.ref}) x->y.assign(q.size(), NAN);  // every entry must be written
  attention_forward(r.flash.y.data(), r.flash.lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
  attention_forward_probs(r.probs.y.data(), r.probs.P.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
  attention_forward_ref(r.ref.y.data(), r.ref.P.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd, r.ref.lse.data());
  EXPECT_LT(rel_err(r.flash.y, r.ref.y), kFastTol);
  EXPECT_LT(rel_err(r.flash.lse, r.ref.lse), kFastTol);
  EXPECT_LT(rel_err(r.probs.y, r.ref.y), kFastTol);
  EXPECT_LT(rel_err(r.probs.P, r.ref.P), kFastTol);
  attention_backward(r.flash.dq.data(), r.flash.dk.data(), r.flash.dv.data(), dy.data(), r.flash.y.data(),
                     r.flash.lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
  attention_backward_probs(r.probs.dq.data(), r.probs.dk.data(), r.probs.dv.data(), dy.data(), r.probs.P.data(), q.data(),
                           k.data(), v.data(), B, T, H, KV, hd);
  attention_backward_ref(r.ref.dq.data(), r.ref.dk.data(), r.ref.dv.data(), dy.data(), r.ref.P.data(), q.data(),
                         k.data(), v.data(), B, T, H, KV, hd);
  for (const AttnRun* x : {&r.flash, &r.probs}) {
    EXPECT_LT(rel_err(x->dq, r.ref.dq), kFastTol) << (x == &r.flash ? "O(T)" : "probs");
    EXPECT_LT(rel_err(x->dk, r.ref.dk), kFastTol) << (x == &r.flash ? "O(T)" : "probs");
    EXPECT_LT(rel_err(x->dv, r.ref.dv), kFastTol) << (x == &r.flash ? "O(T)" : "probs");
  }
  return r;
}

static AttnRun attn_start(const AttnCase& c, float P0, float dq0, float dk0, float dv0) {
  auto [B, T, H, KV, hd] = c;
  return AttnRun{{}, std::vector<float>(B * H * T * T, P0), std::vector<float>(B * H * T, P0),
                 std::vector<float>(B * T * H * hd, dq0), std::vector<float>(B * T * KV * hd, dk0),
                 std::vector<float>(B * T * KV * hd, dv0)};
}

TEST_P(Attention, FastMatchesReferenceAndFiniteDifferences) {
  auto [B, T, H, KV, hd] = GetParam();
  auto q = randn(B * T * H * hd, 12), k = randn(B * T * KV * hd, 13), v = randn(B * T * KV * hd, 14);
  auto dy = randn(B * T * H * hd, 15);
  const AttnRun start = attn_start(GetParam(), 0.f, 0.f, 0.f, 0.f);
  auto runs = fast_and_reference(GetParam(), q, k, v, dy, start);
  std::vector<float> yr(q.size()), P(start.P.size());  // scratch for the checks below
  auto f = [&] {
    attention_forward_ref(yr.data(), P.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
    return dot(yr, dy);
  };
  EXPECT_LT(rel_err(runs.ref.dq, numeric_grad(q, f)), kFdTol);
  EXPECT_LT(rel_err(runs.ref.dk, numeric_grad(k, f)), kFdTol);
  EXPECT_LT(rel_err(runs.ref.dv, numeric_grad(v, f)), kFdTol);
  // Finite differences straight through the O(T) kernel too (float: a looser tolerance).
  std::vector<float> yf(q.size()), lse(start.lse.size());
  auto ff = [&] {
    attention_forward(yf.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
    return dot(yf, dy);
  };
  EXPECT_LT(rel_err(runs.flash.dq, numeric_grad(q, ff)), 20 * kFdTol);
  // Causality: the first position's output depends only on the first k, v.
  auto v2 = v;
  for (int64_t i = KV * hd; i < T * KV * hd; ++i) v2[i] += 1.0f;  // batch 0, positions >= 1
  std::vector<float> y2(q.size());
  attention_forward(y2.data(), lse.data(), q.data(), k.data(), v2.data(), B, T, H, KV, hd);
  for (int64_t i = 0; i < H * hd; ++i) EXPECT_FLOAT_EQ(y2[i], runs.flash.y[i]);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Attention,
                         ::testing::Values(AttnCase{2, 5, 4, 2, 8}, AttnCase{1, 9, 2, 2, 4}, AttnCase{2, 4, 6, 1, 6}));

// T around the row and key block edges (1, 63, 64, 65, 200, 255-257, 1000), MHA and GQA; no finite
// differences here (the reference is checked against them above at small T).
class AttentionBlocked : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionBlocked, FastMatchesReference) {
  auto [B, T, H, KV, hd] = GetParam();
  auto q = randn(B * T * H * hd, 31), k = randn(B * T * KV * hd, 32), v = randn(B * T * KV * hd, 33);
  auto dy = randn(B * T * H * hd, 34);
  // P and lse start as NaN: the forwards must write every entry, P's masked ones as exact zeros.
  // Non-zero starting gradients check that the backwards accumulate.
  const AttnRun start = attn_start(GetParam(), NAN, 0.5f, -0.25f, 0.125f);
  auto runs = fast_and_reference(GetParam(), q, k, v, dy, start);
  const std::vector<float>& P = runs.probs.P;
  int64_t nonzero_masked = 0;
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = t + 1; j < T; ++j) nonzero_masked += P[(bh * T + t) * T + j] != 0.0f;
  EXPECT_EQ(nonzero_masked, 0);
  // Deterministic: a second run from the same starting gradients gives the same bits.
  std::vector<float> dq2 = start.dq, dk2 = start.dk, dv2 = start.dv;
  attention_backward(dq2.data(), dk2.data(), dv2.data(), dy.data(), runs.flash.y.data(), runs.flash.lse.data(), q.data(),
                     k.data(), v.data(), B, T, H, KV, hd);
  EXPECT_EQ(runs.flash.dq, dq2);
  EXPECT_EQ(runs.flash.dk, dk2);
  EXPECT_EQ(runs.flash.dv, dv2);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionBlocked,
                         ::testing::Values(AttnCase{2, 1, 4, 2, 8}, AttnCase{1, 63, 3, 3, 16},
                                           AttnCase{2, kAttnRowBlock, 2, 1, 8},
                                           AttnCase{2, 2 * kAttnRowBlock + 5, 4, 2, 8},  // GQA, partial last block
                                           AttnCase{1, kAttnRowBlock + 1, 3, 3, 16},     // last block of one row
                                           AttnCase{1, 200, 4, 1, 8},
                                           AttnCase{1, kAttnKeyBlock - 1, 2, 2, 8},
                                           AttnCase{1, kAttnKeyBlock, 2, 1, 8},
                                           AttnCase{1, kAttnKeyBlock + 1, 4, 2, 8},      // a second key block of one key
                                           AttnCase{1, 1000, 2, 1, 8}));                 // two key blocks, GQA

TEST(Attention, DecodeMatchesFullForward) {
  const int64_t T = 6, H = 4, KV = 2, hd = 8;
  auto q = randn(T * H * hd, 16), k = randn(T * KV * hd, 17), v = randn(T * KV * hd, 18);
  std::vector<float> y(q.size()), lse(H * T), o(H * hd), scratch(H * T);
  attention_forward(y.data(), lse.data(), q.data(), k.data(), v.data(), 1, T, H, KV, hd);
  for (int64_t t = 0; t < T; ++t) {
    attention_decode(o.data(), q.data() + t * H * hd, k.data(), v.data(), t, H, KV, hd, scratch.data());
    std::vector<float> row(y.begin() + t * H * hd, y.begin() + (t + 1) * H * hd);
    EXPECT_LT(rel_err(o, row), kFastTol) << "t=" << t;
  }
}

// A long cache (its heads split among the threads), GQA, against the double-precision reference.
TEST(Attention, DecodeOfALongCacheMatchesTheReference) {
  const int64_t T = 300, H = 6, KV = 3, hd = 64;
  auto q = randn(T * H * hd, 26), k = randn(T * KV * hd, 27), v = randn(T * KV * hd, 28);
  std::vector<float> y(q.size()), probs(H * T * T), o(H * hd), scratch(H * T);
  attention_forward_ref(y.data(), probs.data(), q.data(), k.data(), v.data(), 1, T, H, KV, hd);
  for (int64_t t : {0L, 1L, 150L, T - 1}) {
    attention_decode(o.data(), q.data() + t * H * hd, k.data(), v.data(), t, H, KV, hd, scratch.data());
    std::vector<float> row(y.begin() + t * H * hd, y.begin() + (t + 1) * H * hd);
    EXPECT_LT(rel_err(o, row), kFastTol) << "t=" << t;
  }
}

// The bf16 cache's kernel: the fp32 kernel's arithmetic on the same (widened) values, bit for bit.
TEST(Attention, DecodeFromABf16CacheEqualsTheF32KernelOnItsValues) {
  const int64_t T = 200, H = 4, KV = 2, hd = 64;
  auto q = randn(T * H * hd, 36), k = randn(T * KV * hd, 37), v = randn(T * KV * hd, 38);
  std::vector<uint16_t> k16(k.size()), v16(v.size());
  quantize_bf16(k16.data(), k.data(), static_cast<int64_t>(k.size()));
  quantize_bf16(v16.data(), v.data(), static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < k.size(); ++i) k[i] = bf16_to_f32(k16[i]), v[i] = bf16_to_f32(v16[i]);
  std::vector<float> o(H * hd), o16(H * hd), scratch(H * T);
  for (int64_t t : {0L, 77L, T - 1}) {
    attention_decode(o.data(), q.data() + t * H * hd, k.data(), v.data(), t, H, KV, hd, scratch.data());
    attention_decode_bf16(o16.data(), q.data() + t * H * hd, k16.data(), v16.data(), t, H, KV, hd, scratch.data());
    EXPECT_EQ(o16, o) << "t=" << t;
  }
}

// Head sizes with and without the vector scores (a multiple of 16 up to 256, or not), MHA and GQA,
// positions on both sides of each block of 16, one and two threads: against the double reference.
TEST(Attention, DecodeEveryHeadSizeAndBlockTailMatchesTheReference) {
  struct Case { int64_t T, H, KV, hd; };
  const int saved_threads = omp_get_max_threads();
  for (const Case c : {Case{40, 12, 12, 64}, Case{35, 16, 8, 128}, Case{20, 2, 1, 256}, Case{33, 4, 2, 8},
                       Case{18, 3, 3, 24}, Case{17, 4, 4, 320}}) {
    auto q = randn(c.T * c.H * c.hd, 46), k = randn(c.T * c.KV * c.hd, 47), v = randn(c.T * c.KV * c.hd, 48);
    std::vector<float> y(q.size()), probs(c.H * c.T * c.T), o(c.H * c.hd), scratch(c.H * c.T);
    attention_forward_ref(y.data(), probs.data(), q.data(), k.data(), v.data(), 1, c.T, c.H, c.KV, c.hd);
    for (int threads : {1, 2})
      for (int64_t t = 0; t < c.T; ++t) {
        omp_set_num_threads(threads);
        attention_decode(o.data(), q.data() + t * c.H * c.hd, k.data(), v.data(), t, c.H, c.KV, c.hd, scratch.data());
        std::vector<float> row(y.begin() + t * c.H * c.hd, y.begin() + (t + 1) * c.H * c.hd);
        EXPECT_LT(rel_err(o, row), kFastTol) << "hd " << c.hd << " H " << c.H << " KV " << c.KV << " t " << t;
      }
  }
  omp_set_num_threads(saved_threads);
}

TEST(SwiGLU, FastMatchesReferenceAndFiniteDifferences) {
  const int64_t n = 301;
  auto g = randn(n, 19, 2.0f), u = randn(n, 20), dy = randn(n, 21);
  std::vector<float> y(n), yr(n), dg(n), du(n), dgr(n), dur(n);
  swiglu_forward(y.data(), g.data(), u.data(), n);
  swiglu_forward_ref(yr.data(), g.data(), u.data(), n);
  EXPECT_LT(rel_err(y, yr), kFastTol);
  swiglu_backward(dg.data(), du.data(), dy.data(), g.data(), u.data(), n);
  swiglu_backward_ref(dgr.data(), dur.data(), dy.data(), g.data(), u.data(), n);
  EXPECT_LT(rel_err(dg, dgr), kFastTol);
  EXPECT_LT(rel_err(du, dur), kFastTol);
  auto f = [&] { swiglu_forward_ref(yr.data(), g.data(), u.data(), n); return dot(yr, dy); };
  EXPECT_LT(rel_err(dgr, numeric_grad(g, f)), kFdTol);
  EXPECT_LT(rel_err(dur, numeric_grad(u, f)), kFdTol);
}

TEST(Embedding, FastMatchesReference) {
  const int64_t V = 11, C = 7, N = 40;
  auto w = randn(V * C, 22), dy = randn(N * C, 23);
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; ++n) ids[n] = static_cast<int32_t>((n * 7 + 3) % V);
  std::vector<float> y(N * C), yr(N * C), dw(V * C, 0.f), dwr(V * C, 0.f);
  embedding_forward(y.data(), ids.data(), w.data(), N, C);
  embedding_forward_ref(yr.data(), ids.data(), w.data(), N, C);
  EXPECT_EQ(y, yr);
  embedding_backward(dw.data(), dy.data(), ids.data(), N, C);
  embedding_backward_ref(dwr.data(), dy.data(), ids.data(), N, C);
  EXPECT_LT(rel_err(dw, dwr), kFastTol);
}

TEST(CrossEntropy, FastMatchesReferencePaddedColumnsNeverCount) {
  const int64_t N = 13, V = 37, Vp = 48;
  auto x = randn(N * Vp, 24, 3.0f);
  // Padded columns hold huge values: they must neither win nor change the loss.
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = V; j < Vp; ++j) x[n * Vp + j] = 1e4f;
  std::vector<int32_t> t(N);
  for (int64_t n = 0; n < N; ++n) t[n] = static_cast<int32_t>((n * 5) % V);
  std::vector<float> d(N * Vp), dr(N * Vp);
  double l = cross_entropy(d.data(), x.data(), t.data(), N, V, Vp, 1.0f / N);
  double lr = cross_entropy_ref(dr.data(), x.data(), t.data(), N, V, Vp, 1.0f / N);
  EXPECT_NEAR(l, lr, 1e-4 * std::abs(lr));
  EXPECT_LT(l / N, 20.0);  // the 1e4 padded logits were ignored
  EXPECT_LT(rel_err(d, dr), kFastTol);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = V; j < Vp; ++j) EXPECT_EQ(d[n * Vp + j], 0.0f);
  auto f = [&] { return cross_entropy_ref(nullptr, x.data(), t.data(), N, V, Vp, 0.f) / N; };
  auto num = numeric_grad(x, f, 1e-2f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = V; j < Vp; ++j) num[n * Vp + j] = 0.0f;  // FD at 1e4 is meaningless; grad is 0 by definition
  EXPECT_LT(rel_err(dr, num), kFdTol);
  // Per-row losses sum to the total.
  std::vector<float> rows(N);
  cross_entropy_rows(rows.data(), x.data(), t.data(), N, V, Vp);
  double rsum = 0;
  for (float r : rows) rsum += r;
  EXPECT_NEAR(rsum, lr, 1e-4 * std::abs(lr));
  // In place (dlogits aliases logits) gives the same result.
  auto xi = x;
  double li = cross_entropy(xi.data(), xi.data(), t.data(), N, V, Vp, 1.0f / N);
  EXPECT_DOUBLE_EQ(li, l);
  EXPECT_EQ(xi, d);
}

TEST(AdamW, FastMatchesReferenceAndTorchFormula) {
  const int64_t n = 1000;
  auto p = randn(n, 25), g = randn(n, 26), m = randn(n, 27, 0.1f), v = randn(n, 28, 0.1f);
  for (auto& x : v) x = x * x;
  auto p2 = p, m2 = m, v2 = v;
  AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f};
  adamw_update(p.data(), g.data(), m.data(), v.data(), n, h);
  adamw_update_ref(p2.data(), g.data(), m2.data(), v2.data(), n, h);
  EXPECT_LT(rel_err(p, p2), 1e-6);
  EXPECT_LT(rel_err(m, m2), 1e-6);
  EXPECT_LT(rel_err(v, v2), 1e-6);
  // One element by hand: step 1 from zero moments moves p by lr*sign(g) (plus decay).
  float pp = 2.0f, gg = -3.0f, mm = 0.0f, vv = 0.0f;
  adamw_update(&pp, &gg, &mm, &vv, 1, AdamWHyper{0.1f, 0.9f, 0.999f, 1e-8f, 0.5f, 1});
  EXPECT_NEAR(pp, 2.0f * (1 - 0.05f) + 0.1f, 1e-5);
}

#include "ops/fast_exp.h"
TEST(FastExp, RelativeErrorBelow3e7OverSoftmaxRange) {
  double worst = 0;
  for (float x = -80.0f; x <= 80.0f; x += 0.001953125f) {
    double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(fast_expf(x) - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(fast_expf(0.0f), 1.0f);
  EXPECT_LT(fast_expf(-1000.0f), 1e-37f);  // clamped, not NaN
}
