// The bootstrap of the isoFLOPs compute saving (scaling/bootstrap.h): exact on noiseless profiles,
// an interval that covers the true saving and widens with the noise, reproducible by seed, and
// clear failures on input it cannot resample.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "scaling/bootstrap.h"
#include "scaling/frontier.h"
#include "scaling/isoflops.h"

using namespace jtok;

namespace {
// Base frontier log2 L* = alpha log10 C + beta; the other variant's intercept is lower by delta.
// Profiles: loss = L*(C) + 0.3 (u - u*)^2 at u = log10 N_c, u* = 0.5 log10 C - 1.2, with
// n_shapes runs spaced 0.3 apart around u* (shifted by 0.1 so u* is not a sampled point).
constexpr double kAlpha = -0.2, kBeta = 5.0, kDelta = 0.03;
std::vector<IsoPoint> profiles(double beta, double noise_sd, uint32_t seed, int n_shapes = 6) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> noise(0.0, noise_sd);
  std::vector<IsoPoint> pts;
  for (double lc : {11.0, 11.5, 12.0}) {
    double C = std::pow(10.0, lc), u0 = 0.5 * lc - 1.2, l0 = std::pow(2.0, kAlpha * lc + beta);
    for (int i = 0; i < n_shapes; ++i) {
      double du = 0.3 * (i - (n_shapes - 1) / 2.0) + 0.1;
      pts.push_back({C, std::pow(10.0, u0 + du), l0 + 0.3 * du * du + (noise_sd > 0 ? noise(rng) : 0.0)});
    }
  }
  return pts;
}
double true_saving() { return compute_saving(kAlpha, kBeta, kBeta - kDelta); }  // 1 - 10^(0.03 / -0.2) = 29.2 %
}  // namespace

TEST(Bootstrap, QuantileInterpolatesOrderStatistics) {
  EXPECT_DOUBLE_EQ(quantile({3, 1, 2, 4}, 0.0), 1);
  EXPECT_DOUBLE_EQ(quantile({3, 1, 2, 4}, 1.0), 4);
  EXPECT_DOUBLE_EQ(quantile({3, 1, 2, 4}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile({10, 20}, 0.25), 12.5);
  EXPECT_THROW(quantile({}, 0.5), Error);
  EXPECT_THROW(quantile({1}, 1.5), Error);
}

TEST(Bootstrap, NoiselessProfilesGiveAZeroWidthIntervalAtTheTrueSaving) {
  // Every resample of an exact quadratic with >= 3 distinct N_c refits the same quadratic, so
  // every replicate equals the point estimate, which equals the true saving.
  auto base = profiles(kBeta, 0, 1), other = profiles(kBeta - kDelta, 0, 2);
  for (std::string method : {"cases", "residuals"}) {
    BootstrapOptions o;
    o.replicates = 200, o.method = method;
    SavingBootstrap b = bootstrap_saving({base, other}, o);
    ASSERT_EQ(b.replicates, 200);
    ASSERT_EQ(b.saving_separate.size(), 2u);
    EXPECT_NEAR(b.separate[1].lo, true_saving(), 1e-9) << method;
    EXPECT_NEAR(b.separate[1].hi, true_saving(), 1e-9) << method;
    EXPECT_NEAR(b.shared_slope[1].median, true_saving(), 1e-9) << method;
    EXPECT_NEAR(b.alpha_pct[0].lo, kAlpha, 1e-9) << method;
    EXPECT_EQ(b.lowest_run_replicates, 0) << method;
    EXPECT_EQ(b.separate[0].hi, 0.0);  // the base against itself
  }
}

TEST(Bootstrap, IntervalCoversTheTruthAndWidensWithNoise) {
  auto width = [](double sd, const std::string& method, Percentiles* shared) {
    auto base = profiles(kBeta, sd, 11), other = profiles(kBeta - kDelta, sd, 12);
    BootstrapOptions o;
    o.replicates = 400, o.method = method, o.seed = 5;
    SavingBootstrap b = bootstrap_saving({base, other}, o);
    *shared = b.shared_slope[1];
    EXPECT_LE(b.shared_slope[1].lo, b.shared_slope[1].median);
    EXPECT_LE(b.shared_slope[1].median, b.shared_slope[1].hi);
    return b.shared_slope[1].hi - b.shared_slope[1].lo;
  };
  for (std::string method : {"cases", "residuals"}) {
    Percentiles small, large;
    double w_small = width(0.002, method, &small), w_large = width(0.02, method, &large);
    EXPECT_GT(w_small, 0.0) << method;
    EXPECT_GT(w_large, 2 * w_small) << method;
    EXPECT_LE(small.lo, true_saving()) << method;
    EXPECT_GE(small.hi, true_saving()) << method;
    EXPECT_LE(large.lo, true_saving()) << method;
    EXPECT_GE(large.hi, true_saving()) << method;
  }
}

TEST(Bootstrap, SameSeedSameReplicatesOtherSeedOthers) {
  auto base = profiles(kBeta, 0.01, 3), other = profiles(kBeta - kDelta, 0.01, 4);
  BootstrapOptions o;
  o.replicates = 50, o.seed = 9;
  auto a = bootstrap_saving({base, other}, o), b = bootstrap_saving({base, other}, o);
  EXPECT_EQ(a.saving_separate[1], b.saving_separate[1]);
  o.seed = 10;
  auto c = bootstrap_saving({base, other}, o);
  EXPECT_NE(a.saving_separate[1], c.saving_separate[1]);
}

TEST(Bootstrap, ThreeRunProfilesAreRedrawnUntilTheyHoldThreeDistinctShapes) {
  // With 3 runs, only the 6 of 27 draws that take each run once carry a quadratic: the cases
  // method redraws the rest, so every replicate is the original profile.
  auto base = profiles(kBeta, 0.01, 5, 3), other = profiles(kBeta - kDelta, 0.01, 6, 3);
  BootstrapOptions o;
  o.replicates = 20;
  auto b = bootstrap_saving({base, other}, o);
  EXPECT_GT(b.redraws, 0);
  EXPECT_NEAR(b.separate[1].lo, b.separate[1].hi, 1e-12);
  o.method = "residuals";  // 3 runs leave no residual degree of freedom
  EXPECT_THROW(bootstrap_saving({base, other}, o), Error);
}

TEST(Bootstrap, BadInputFails) {
  auto base = profiles(kBeta, 0.01, 7), other = profiles(kBeta - kDelta, 0.01, 8);
  BootstrapOptions o;
  EXPECT_THROW(bootstrap_saving({base}, o), Error);  // nothing to compare
  o.method = "jackknife";
  EXPECT_THROW(bootstrap_saving({base, other}, o), Error);
  o = BootstrapOptions{};
  o.replicates = 0;
  EXPECT_THROW(bootstrap_saving({base, other}, o), Error);
  o = BootstrapOptions{};
  std::vector<IsoPoint> two_budgets;  // a frontier needs 3 budgets
  for (auto& p : base)
    if (p.budget < 5e11) two_budgets.push_back(p);
  EXPECT_THROW(bootstrap_saving({two_budgets, other}, o), Error);
  auto same_nc = base;  // a profile with the same N_c three times: no quadratic
  for (size_t i = 0; i < 6; ++i) same_nc[i].n_c = i < 3 ? 1e4 : 2e4;
  EXPECT_THROW(bootstrap_saving({same_nc, other}, o), Error);
}

TEST(Bootstrap, ResamplesWhoseMinimumFallsBelowZeroAreDrawnAgain) {
  // Per budget 4 runs at u = 0..3 whose 3-run subsets {0,1,2} put the quadratic's minimum at a
  // negative loss (log2 L undefined); the full profile's minimum is positive. Such resamples are
  // counted and drawn again; every kept replicate is finite.
  std::vector<IsoPoint> base, other;
  const double l[4] = {1.0, 0.05, 0.06, 2.0};
  for (double lc : {11.0, 11.5, 12.0})
    for (int i = 0; i < 4; ++i) {
      double scale = std::pow(2.0, -0.2 * (lc - 11));
      base.push_back({std::pow(10.0, lc), 1e4 * std::pow(10.0, i), 0.3 + scale * l[i]});
      other.push_back({std::pow(10.0, lc), 1e4 * std::pow(10.0, i), 0.28 + scale * l[i]});
    }
  for (auto& p : fit_isoflops(base)) ASSERT_GT(p.loss_opt, 0.0);
  BootstrapOptions o;
  o.replicates = 300;
  SavingBootstrap b = bootstrap_saving({base, other}, o);
  EXPECT_GT(b.failed_resamples, 0);
  EXPECT_EQ(b.saving_shared_slope[1].size(), 300u);
  for (double v : b.saving_shared_slope[1]) EXPECT_TRUE(std::isfinite(v));
}
