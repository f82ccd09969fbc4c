// bf16 mixed-precision matrix products (ops/linear.h gemm_bf16, train/precision.h): on a CPU with
// AVX-512 BF16 the product equals the double-accumulated product of the bf16-rounded inputs (fp32
// accumulation error only) and stays within bf16's rounding of the fp32 product; gemm() follows the
// process precision. Without AVX-512 BF16 the training precision falls back to fp32 and says so.
// Operands rounded once and reused (ops/bf16_weights.h's weight copies, linear_forward_many /
// linear_backward_many's shared inputs) give the bits of rounding them per product, and a
// training run with the trainer's per-step weight scope the bits of one without it.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>

#include "core/error.h"
#include "error_test_util.h"
#include "model_test_util.h"
#include "ops/bf16_weights.h"
#include "ops/linear.h"
#include "ops/lowp_linear.h"
#include "train/optimizer.h"
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

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

// Sets the process precision for one test and puts fp32 back after it.
struct PrecisionGuard {
  explicit PrecisionGuard(MatmulPrecision p) { set_matmul_precision(p); }
  ~PrecisionGuard() { set_matmul_precision(MatmulPrecision::fp32); }
};

// Three weights (rows 24, 8, 8) of one input (N, C), as q / k / v; outputs and gradients of
// linear_forward_many / linear_backward_many, or of one gemm_bf16 per product (per_call).
struct Three {
  int64_t N = 33, C = 40;
  int64_t rows[3] = {24, 8, 8};
  std::vector<float> x = randn(33 * 40, 11), w[3], dout[3];
  Three() {
    for (int i = 0; i < 3; ++i) {
      w[i] = randn(static_cast<size_t>(rows[i] * C), 20 + i, 0.5f);
      dout[i] = randn(static_cast<size_t>(N * rows[i]), 30 + i);
    }
  }
  // out[0..2], then dx, then dw[0..2]: every value the products wrote.
  std::vector<std::vector<float>> run(bool per_call) const {
    std::vector<std::vector<float>> r(7);
    for (int i = 0; i < 3; ++i) r[i] = randn(static_cast<size_t>(N * rows[i]), 40 + i);  // k accumulates onto it
    r[3] = randn(static_cast<size_t>(N * C), 50);
    for (int i = 0; i < 3; ++i) r[4 + i] = randn(static_cast<size_t>(rows[i] * C), 60 + i);
    if (per_call) {
      for (int i = 0; i < 3; ++i) {
        gemm_bf16(false, true, N, rows[i], C, 1.0f, x.data(), C, w[i].data(), C, i == 1 ? 1.0f : 0.0f, r[i].data(), rows[i]);
        gemm_bf16(false, false, N, C, rows[i], 1.0f, dout[i].data(), rows[i], w[i].data(), C, 1.0f, r[3].data(), C);
        gemm_bf16(true, false, rows[i], C, N, 1.0f, dout[i].data(), rows[i], x.data(), C, 1.0f, r[4 + i].data(), C);
      }
      return r;
    }
    LinearProduct p[3];
    LinearGrad g[3];
    for (int i = 0; i < 3; ++i) {
      p[i] = {r[i].data(), w[i].data(), rows[i], i == 1};
      g[i] = {r[4 + i].data(), dout[i].data(), w[i].data(), rows[i]};
    }
    linear_forward_many(p, 3, x.data(), N, C);
    linear_backward_many(r[3].data(), g, 3, x.data(), N, C);
    return r;
  }
};

// Without AVX-512 BF16, bf16 precision is refused, naming what the CPU lacks, and fp32 stays.
void expect_bf16_precision_refused() {
  expect_error([] { set_matmul_precision(MatmulPrecision::bf16); }, {"bf16 matmul needs AVX-512 BF16"});
  EXPECT_EQ(matmul_precision(), MatmulPrecision::fp32);
}

}  // namespace

TEST(Bf16Matmul, RoundedOnceGivesThePerCallBits) {
  if (!bf16_matmul_supported()) return expect_bf16_precision_refused();
  PrecisionGuard guard(MatmulPrecision::bf16);
  Three t;
  const auto want = t.run(true);
  const auto plain = t.run(false);  // no scope: weights rounded per call, inputs once per call of _many
  const int64_t before = bf16_weight_conversions();
  std::vector<std::vector<float>> scoped, again;
  {
    const Bf16WeightScope scope;
    EXPECT_TRUE(bf16_weight_scope_open());
    scoped = t.run(false);
    again = t.run(false);  // the copies reused
  }
  EXPECT_FALSE(bf16_weight_scope_open());
  EXPECT_EQ(bf16_weight_conversions() - before, 3);  // each weight once for six products (twice)
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(same_bits(plain[i], want[i])) << "output " << i;
    EXPECT_TRUE(same_bits(scoped[i], want[i])) << "output " << i;
    EXPECT_TRUE(same_bits(again[i], want[i])) << "output " << i;
  }
  // A weight changed between scopes (the optimizer step): the next scope rounds it afresh.
  for (auto& v : t.w[0]) v *= 1.5f;
  const auto want2 = t.run(true);
  EXPECT_FALSE(same_bits(want2[0], want[0]));
  const Bf16WeightScope scope;
  EXPECT_TRUE(same_bits(t.run(false)[0], want2[0]));
  EXPECT_TRUE(same_bits(t.run(false)[3], want2[3]));
}

TEST(Bf16Matmul, ManyProductsInFp32AreOneGemmEach) {
  PrecisionGuard guard(MatmulPrecision::fp32);
  Three t;
  const auto got = t.run(false);
  std::vector<std::vector<float>> want(7);
  for (int i = 0; i < 3; ++i) want[i] = randn(static_cast<size_t>(t.N * t.rows[i]), 40 + i);
  want[3] = randn(static_cast<size_t>(t.N * t.C), 50);
  for (int i = 0; i < 3; ++i) want[4 + i] = randn(static_cast<size_t>(t.rows[i] * t.C), 60 + i);
  for (int i = 0; i < 3; ++i) {
    gemm_f32(false, true, t.N, t.rows[i], t.C, 1.0f, t.x.data(), t.C, t.w[i].data(), t.C, i == 1 ? 1.0f : 0.0f,
             want[i].data(), t.rows[i]);
    linear_backward(want[3].data(), want[4 + i].data(), t.dout[i].data(), t.x.data(), t.w[i].data(), t.N, t.C, t.rows[i]);
  }
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(same_bits(got[i], want[i])) << "output " << i;
}

namespace {

// Three bf16 training steps of a model made from c: its parameters after them, with the
// trainer's weight scope around each step's forward and backward, or without.
std::vector<float> train3(const ModelConfig& c, bool scoped) {
  Model m = make_model(c, 7);
  AdamWState st = make_adamw_state(m);
  Activations a;
  a.row_sync = table_row_sync(m, st);
  TrainConfig t;
  t.learning_rate = 1e-2;
  t.warmup_steps = 0;
  const int64_t B = 2, T = 8;
  for (int step = 0; step < 3; ++step) {
    const auto x = tokens(B * T, c.vocab_size, 100 + step), y = tokens(B * T, c.vocab_size, 200 + step);
    zero_grads(m);
    {
      std::optional<Bf16WeightScope> scope;
      if (scoped) scope.emplace();
      forward(m, a, x.data(), B, T);
      backward(m, a, x.data(), y.data());
    }
    optimizer_step(m, st, t);
  }
  sync_tables(m, st);
  std::vector<float> p(m.params.begin(), m.params.end());
  for (const TokenTable& tb : m.tables) p.insert(p.end(), tb.data(), tb.data() + tb.numel());
  return p;
}

// JTok on layer 1, JTok-M on layer 0, a vocabulary of 50 padded to 64; moe: MoE from layer 1.
ModelConfig small(bool moe) {
  ModelConfig c = tiny_jtok_config({.vocab = 50, .context = 16});
  c.vocab_pad_multiple = 16;
  return moe ? with_small_moe(c, 16) : c;
}

}  // namespace

TEST(Bf16Matmul, WeightScopeTrainsTheSameBits) {
  if (!bf16_matmul_supported()) return expect_bf16_precision_refused();
  for (bool moe : {false, true}) {
    const ModelConfig c = small(moe);
    std::vector<float> fp32, plain, scoped;
    {
      PrecisionGuard guard(MatmulPrecision::fp32);
      fp32 = train3(c, true);
    }
    PrecisionGuard guard(MatmulPrecision::bf16);
    plain = train3(c, false);
    scoped = train3(c, true);  // a copy kept past an optimizer step would change the next steps
    EXPECT_TRUE(same_bits(scoped, plain)) << (moe ? "moe" : "dense");
    EXPECT_FALSE(same_bits(plain, fp32)) << "bf16 did not run";
  }
}
