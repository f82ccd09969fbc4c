// infer/logit_compare.h: the per-position comparison `jtok eval --reference` reports, against the
// definitions computed a second way (probabilities, not log-softmax) and on cases with known values.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "infer/logit_compare.h"

using namespace jtok;

namespace {

// KL(q || p) from probabilities: sum_v q_v log(q_v / p_v).
double kl_by_probabilities(const float* x, const float* ref, int64_t V) {
  double zp = 0, zq = 0;
  for (int64_t v = 0; v < V; ++v) zp += std::exp(static_cast<double>(x[v])), zq += std::exp(static_cast<double>(ref[v]));
  double kl = 0;
  for (int64_t v = 0; v < V; ++v) {
    const double p = std::exp(static_cast<double>(x[v])) / zp, q = std::exp(static_cast<double>(ref[v])) / zq;
    kl += q * std::log(q / p);
  }
  return kl;
}

}  // namespace

TEST(LogitCompare, TwoTokensByHand) {
  // p = (1/2, 1/2), q = (3/4, 1/4): KL(q || p) = 3/4 log(3/2) + 1/4 log(1/2); the argmaxes
  // differ only in that p ties (first index: 0, as q's); target 1: log(1/2) - log(1/4) = log 2.
  const float x[4] = {0.0f, 0.0f, 99.0f, 99.0f};  // columns 2, 3: padding, never read
  const float ref[4] = {std::log(3.0f), 0.0f, -99.0f, -99.0f};
  const int32_t target = 1;
  LogitComparison c;
  compare_logits(c, x, ref, &target, 1, 2, 4);
  EXPECT_EQ(c.positions, 1);
  EXPECT_EQ(c.top1_same, 1);
  EXPECT_NEAR(c.kl_sum, 0.75 * std::log(1.5) + 0.25 * std::log(0.5), 1e-7);
  EXPECT_NEAR(c.dlogp_sum, std::log(2.0), 1e-7);
  EXPECT_NEAR(c.dlogp_abs_max, std::log(2.0), 1e-7);
}

TEST(LogitCompare, RandomRowsAgainstProbabilities) {
  const int64_t N = 37, V = 301, ld = 320;
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 3.0f);
  std::vector<float> x(N * ld), ref(N * ld);
  std::vector<int32_t> t(N);
  for (auto& v : ref) v = g(rng);
  for (size_t i = 0; i < x.size(); ++i) x[i] = ref[i] + 0.3f * g(rng);
  for (int64_t n = 0; n < N; ++n) t[n] = static_cast<int32_t>(rng() % V);
  LogitComparison c;
  compare_logits(c, x.data(), ref.data(), t.data(), N, V, ld);
  double kl = 0, kl_max = 0;
  int64_t same = 0;
  for (int64_t n = 0; n < N; ++n) {
    const double k = kl_by_probabilities(x.data() + n * ld, ref.data() + n * ld, V);
    kl += k, kl_max = std::max(kl_max, k);
    int64_t ap = 0, aq = 0;
    for (int64_t v = 1; v < V; ++v) {
      if (x[n * ld + v] > x[n * ld + ap]) ap = v;
      if (ref[n * ld + v] > ref[n * ld + aq]) aq = v;
    }
    same += ap == aq;
  }
  EXPECT_EQ(c.positions, N);
  EXPECT_EQ(c.top1_same, same);
  EXPECT_LT(same, N);  // the noise flips some argmaxes: the count is really checked
  EXPECT_NEAR(c.kl_sum, kl, 1e-9 * N + 1e-6 * kl);
  EXPECT_NEAR(c.kl_max, kl_max, 1e-6 * kl_max);
  EXPECT_GT(c.kl_sum, 0.0);
}

TEST(LogitCompare, EqualOrShiftedLogitsAreTheSameDistribution) {
  const int64_t N = 5, V = 50;
  std::vector<float> ref(N * V), shifted(N * V);
  std::vector<int32_t> t(N, 3);
  for (int64_t i = 0; i < N * V; ++i) ref[i] = static_cast<float>((i * 37) % 11) * 0.5f, shifted[i] = ref[i] + 4.0f;
  LogitComparison c;
  compare_logits(c, ref.data(), ref.data(), t.data(), N, V, V);
  compare_logits(c, shifted.data(), ref.data(), t.data(), N, V, V);
  EXPECT_EQ(c.positions, 2 * N);
  EXPECT_EQ(c.top1_same, 2 * N);
  EXPECT_LT(c.kl_max, 1e-12);
  EXPECT_LT(c.dlogp_abs_max, 1e-6);
}

TEST(LogitCompare, TargetOutsideTheVocabularyIsAnError) {
  const float x[3] = {0, 0, 0};
  const int32_t t = 3;
  LogitComparison c;
  EXPECT_THROW(compare_logits(c, x, x, &t, 1, 3, 3), Error);
}
