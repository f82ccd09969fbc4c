// The scaling-law fits recover the known parameters of synthetic data drawn from a known law.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "scaling/frontier.h"
#include "scaling/isoflops.h"
#include "scaling/kaplan.h"
#include "scaling/lstsq.h"

using namespace jtok;

TEST(Lstsq, ExactSolutionOfOverdeterminedConsistentSystem) {
  // y = 2 x0 - 3 x1 + 0.5 on 5 points.
  std::vector<double> A, y;
  double pts[5][2] = {{1, 2}, {3, -1}, {0.5, 0.25}, {-2, 4}, {7, 1}};
  for (auto& p : pts) A.insert(A.end(), {p[0], p[1], 1.0}), y.push_back(2 * p[0] - 3 * p[1] + 0.5);
  auto x = lstsq(A, 5, 3, y);
  EXPECT_NEAR(x[0], 2, 1e-12);
  EXPECT_NEAR(x[1], -3, 1e-12);
  EXPECT_NEAR(x[2], 0.5, 1e-12);
}

TEST(Lstsq, RankDeficientFails) {
  std::vector<double> A = {1, 2, 2, 4, 3, 6};  // second column = 2 x first
  EXPECT_THROW(lstsq(A, 3, 2, {1, 2, 3}), Error);
}

TEST(Quadratic, MinimumOfNoiselessParabolaAtLargeX) {
  // loss = 0.3 (u - 8.7)^2 + 2.1 at u = log10 N around 8-9.5: centring keeps this exact.
  std::vector<double> u, l;
  for (double x = 7.9; x < 9.6; x += 0.25) u.push_back(x), l.push_back(0.3 * (x - 8.7) * (x - 8.7) + 2.1);
  QuadFit q = fit_quadratic(u, l);
  EXPECT_NEAR(q.argmin(), 8.7, 1e-9);
  EXPECT_NEAR(q.at(q.argmin()), 2.1, 1e-10);
  EXPECT_NEAR(q.r2, 1.0, 1e-12);
}

TEST(IsoFlops, RecoversMinimaOfSyntheticProfiles) {
  // Per budget: minimum at log10 N* = 0.5 log10 C - 1.2, L* = 10 C^-0.05, curvature 0.4.
  std::vector<IsoPoint> pts;
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0.0, 0.002);
  for (double lc : {17.0, 18.0, 19.0}) {
    double C = std::pow(10.0, lc), u0 = 0.5 * lc - 1.2, l0 = 10 * std::pow(C, -0.05);
    for (double du = -0.9; du <= 0.9001; du += 0.3)
      pts.push_back({C, std::pow(10.0, u0 + du), l0 + 0.4 * du * du + noise(rng)});
  }
  auto mins = fit_isoflops(pts);
  ASSERT_EQ(mins.size(), 3u);
  for (auto& m : mins) {
    double lc = std::log10(m.budget);
    EXPECT_NEAR(std::log10(m.n_c_opt), 0.5 * lc - 1.2, 0.02) << "budget " << m.budget;
    EXPECT_NEAR(m.loss_opt, 10 * std::pow(m.budget, -0.05), 0.003);
    EXPECT_NEAR(m.tokens_opt, m.budget / (6 * m.n_c_opt), 1e-6 * m.tokens_opt);
    EXPECT_FALSE(m.extrapolated);
    EXPECT_EQ(m.n_points, 7);
    EXPECT_EQ(m.method, "quadratic");
  }
  // A window of 3 around the lowest point still finds the noiseless minimum.
  std::vector<IsoPoint> clean;
  for (double du = -1.5; du <= 1.5001; du += 0.5) clean.push_back({1e18, std::pow(10.0, 7.3 + du), 3 + 0.2 * du * du});
  auto w = fit_isoflops(clean, 3);
  EXPECT_EQ(w[0].n_points, 3);
  EXPECT_NEAR(std::log10(w[0].n_c_opt), 7.3, 1e-9);
}

TEST(IsoFlops, ConcaveProfileFallsBackToLowestRunAndTooSmallFails) {
  // A cap: the quadratic opens downwards, so the lowest run (an end of the range) stands in.
  std::vector<IsoPoint> cap = {{1e18, 1e7, 3.1}, {1e18, 1e8, 3.5}, {1e18, 1e9, 3.0}};
  auto c = fit_isoflops(cap);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].method, "lowest_run");
  EXPECT_DOUBLE_EQ(c[0].n_c_opt, 1e9);
  EXPECT_DOUBLE_EQ(c[0].loss_opt, 3.0);
  EXPECT_DOUBLE_EQ(c[0].tokens_opt, 1e18 / 6e9);
  EXPECT_TRUE(c[0].extrapolated);
  // Monotone and concave (a short study where the smallest model wins): lowest run at the left end.
  std::vector<IsoPoint> mono = {{1e18, 1e7, 2.0}, {1e18, 1e8, 2.9}, {1e18, 3e8, 3.3}, {1e18, 1e9, 3.5}};
  auto m = fit_isoflops(mono);
  EXPECT_EQ(m[0].method, "lowest_run");
  EXPECT_DOUBLE_EQ(m[0].n_c_opt, 1e7);
  EXPECT_TRUE(m[0].extrapolated);
  std::vector<IsoPoint> two = {{1e18, 1e7, 3.0}, {1e18, 1e8, 2.5}};
  EXPECT_THROW(fit_isoflops(two), Error);
}

TEST(Frontier, RecoversAlphaBetaAndSavings) {
  // log2 L = -0.2 log10 C + 5.1 (base), intercept 0.04 lower (other) with the same slope.
  std::vector<double> C, Lb, Lo;
  for (double lc = 18; lc <= 20.51; lc += 0.5) {
    C.push_back(std::pow(10.0, lc));
    Lb.push_back(std::pow(2.0, -0.2 * lc + 5.1));
    Lo.push_back(std::pow(2.0, -0.2 * lc + 5.06));
  }
  auto f = fit_frontier(C, Lb);
  EXPECT_NEAR(f.alpha, -0.2, 1e-12);
  EXPECT_NEAR(f.beta, 5.1, 1e-10);
  EXPECT_NEAR(f.r2, 1.0, 1e-12);
  auto cmp = compare_frontiers({C, C}, {Lb, Lo});
  double want = 1 - std::pow(10.0, 0.04 / -0.2);  // 36.9%
  EXPECT_NEAR(cmp.saving_separate[1], want, 1e-9);
  EXPECT_NEAR(cmp.saving_shared_slope[1], want, 1e-9);
  EXPECT_NEAR(cmp.shared.slope, -0.2, 1e-12);
  EXPECT_NEAR(cmp.shared.intercepts[0] - cmp.shared.intercepts[1], 0.04, 1e-10);
  // The saving formula itself: 0.038 / -0.2016 is the paper's 35.2%.
  EXPECT_NEAR(compute_saving(-0.2016, 0.038, 0.0), 0.352, 5e-4);
}

TEST(Frontier, SharedSlopeIsTheCommonSlopeOfNoisyParallelLines) {
  // Two frontiers with slope -0.15 and different intercepts, small noise on different points:
  // the shared slope lies near -0.15 and the intercept gap near the true 0.05.
  std::mt19937 rng(3);
  std::normal_distribution<double> noise(0.0, 0.001);
  std::vector<double> C1, L1, C2, L2;
  for (double lc = 17; lc <= 21.01; lc += 0.25) {
    C1.push_back(std::pow(10.0, lc)), L1.push_back(std::pow(2.0, -0.15 * lc + 4.0 + noise(rng)));
    C2.push_back(std::pow(10.0, lc + 0.1)), L2.push_back(std::pow(2.0, -0.15 * (lc + 0.1) + 3.95 + noise(rng)));
  }
  auto cmp = compare_frontiers({C1, C2}, {L1, L2});
  EXPECT_NEAR(cmp.shared.slope, -0.15, 1e-3);
  EXPECT_NEAR(cmp.shared.intercepts[0] - cmp.shared.intercepts[1], 0.05, 2e-3);
  EXPECT_GT(cmp.shared.r2, 0.999);
  // Separate slopes differ a little; the separate-intercept saving extrapolates them to C = 1.
  EXPECT_NEAR(cmp.separate[0].alpha, -0.15, 2e-3);
}

TEST(Frontier, TooFewPointsFail) {
  EXPECT_THROW(fit_frontier({1e18, 1e19}, {2.5, 2.3}), Error);
  EXPECT_THROW(fit_frontier({1e18, 1e19, -1}, {2.5, 2.3, 2.1}), Error);
}

TEST(Eta, LogLinearSlopePerDoubling) {
  std::vector<double> eta, loss;
  for (double e : {30.0, 50.0, 70.0, 90.0, 110.0, 130.0}) eta.push_back(e), loss.push_back(2.3 - 0.0118 * std::log2(e));
  auto f = fit_eta(eta, loss);
  EXPECT_NEAR(f.slope, -0.0118, 1e-12);
  EXPECT_NEAR(f.intercept, 2.3, 1e-12);
}

namespace {
// Runs of an isoFLOP design: budgets 1e17..1e20, N_c from 1e6 to 3e9, D = C / (6 N).
void kaplan_design(const KaplanParams& p, double noise_sd, unsigned seed, std::vector<double>& n,
                   std::vector<double>& d, std::vector<double>& l) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> noise(0.0, noise_sd);
  for (double lc : {17.0, 18.0, 19.0, 20.0})
    for (double ln = 6.0; ln <= 9.51; ln += 0.5) {
      double N = std::pow(10.0, ln), D = std::pow(10.0, lc) / (6 * N);
      if (D < 1e7) continue;
      n.push_back(N), d.push_back(D), l.push_back(p.loss(N, D) * std::exp(noise(rng)));
    }
}
}  // namespace

TEST(Kaplan, RecoversKaplanConstantsFromNoiselessData) {
  KaplanParams truth{8.8e13, 5.4e13, 0.076, 0.095};  // Kaplan et al.'s N_c, D_c, alpha_N, alpha_D
  std::vector<double> n, d, l;
  kaplan_design(truth, 0.0, 1, n, d, l);
  ASSERT_GE(n.size(), 20u);
  auto f = fit_kaplan(n, d, l);
  EXPECT_NEAR(f.p.alpha, truth.alpha, 1e-4);
  EXPECT_NEAR(f.p.beta, truth.beta, 1e-4);
  EXPECT_NEAR(std::log10(f.p.A), std::log10(truth.A), 0.02);
  EXPECT_NEAR(std::log10(f.p.B), std::log10(truth.B), 0.02);
  EXPECT_LT(f.rmse_log, 1e-6);
}

TEST(Kaplan, RecoversSteeperLawFromNoisyData) {
  KaplanParams truth{3e8, 2e9, 0.34, 0.28};
  std::vector<double> n, d, l;
  kaplan_design(truth, 0.003, 11, n, d, l);
  auto f = fit_kaplan(n, d, l);
  EXPECT_NEAR(f.p.alpha, truth.alpha, 0.03);
  EXPECT_NEAR(f.p.beta, truth.beta, 0.03);
  EXPECT_NEAR(std::log10(f.p.A), std::log10(truth.A), 0.3);
  EXPECT_NEAR(std::log10(f.p.B), std::log10(truth.B), 0.3);
  EXPECT_NEAR(f.p.frontier_exponent(), truth.frontier_exponent(), 0.01);
  EXPECT_GT(f.r2, 0.99);
}

TEST(Kaplan, TooFewPointsFail) {
  EXPECT_THROW(fit_kaplan({1e6, 1e7, 1e8}, {1e9, 1e9, 1e9}, {3, 2.8, 2.6}), Error);
}
