// JTok-M: routing (top-K ties), the fast path against its per-position reference, finite
// differences through routing, mixing, norm and the aux loss, and the sparse gather.
#include <gtest/gtest.h>

#include <ostream>

#include <cmath>
#include <random>
#include <set>

#include "op_test_util.h"
#include "model/jtokm.h"
#include "model/top_k.h"

using namespace jtok;
using namespace jtok::testing;

namespace {
std::vector<int32_t> repeated_ids(int64_t N, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(N);
  for (auto& x : ids) x = static_cast<int32_t>((rng() % 5) * (rng() % 3) % V);
  ids[0] = static_cast<int32_t>(V - 1);
  return ids;
}
std::vector<TokenTable> tables(int64_t n_e, int64_t V, int64_t d, uint64_t seed) {
  std::vector<TokenTable> t(static_cast<size_t>(n_e));
  for (int64_t i = 0; i < n_e; ++i) {
    t[i].rows = V;
    t[i].dim = d;
    t[i] = TokenTable::in_ram(V, d, randn(static_cast<size_t>(V * d), seed + static_cast<uint64_t>(i), 0.5f));
  }
  return t;
}
}  // namespace

TEST(JTokMRouting, TopKDescendingTiesToTheLowerIndex) {
  int32_t idx[3];
  const float x[5] = {0.5f, 2.0f, 0.5f, 2.0f, -1.0f};
  top_k_lower_index(idx, x, 5, 3);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 3);
  EXPECT_EQ(idx[2], 0);  // 0 and 2 tie: the lower index wins
  const float z[4] = {0, 0, 0, 0};
  top_k_lower_index(idx, z, 4, 2);
  EXPECT_EQ(idx[0], 0);
  EXPECT_EQ(idx[1], 1);
}

struct JmCase { bool norm; bool depth; int64_t n_e, K; };
// Test names show the case, not its raw bytes (padding made them differ from build to build).
void PrintTo(const JmCase& c, std::ostream* os) {
  *os << "norm=" << c.norm << " depth=" << c.depth << " n_e=" << c.n_e << " K=" << c.K;
}
class JTokMLayer : public ::testing::TestWithParam<JmCase> {};

TEST_P(JTokMLayer, FastMatchesReferenceAndFiniteDifferences) {
  const auto P = GetParam();
  const int64_t N = 20, d = 8, V = 13;
  JTokMHyper hp;
  hp.n_e = P.n_e;
  hp.K = P.K;
  hp.norm = P.norm;
  hp.c = P.depth ? static_cast<float>(1.0 / std::sqrt(2.0 * 6)) : 1.0f;
  hp.lambda = 0.3;  // large, so the aux gradient is visible in the checks
  auto ids = repeated_ids(N, V, 1);
  auto E = tables(hp.n_e, V, d, 10);
  auto a = randn(N * d, 2), R = randn(hp.n_e * d, 3, 0.7f), s = randn(d, 4), h0 = randn(N * d, 5), dh = randn(N * d, 6);
  RowBatch rb = dedup_ids(ids.data(), N, V);
  ASSERT_LT(rb.unique.size(), static_cast<size_t>(N / 2));

  JTokMActs A;
  std::vector<float> h = h0, hr = h0;
  jtokm_forward(h.data(), A, a.data(), R.data(), s.data(), E.data(), rb, N, d, hp);
  const double aux_r = jtokm_forward_ref(hr.data(), a.data(), R.data(), s.data(), E.data(), ids.data(), N, d, hp);
  EXPECT_LT(rel_err(h, hr), 1e-6);
  EXPECT_NEAR(A.aux, aux_r, 1e-9 + 1e-6 * aux_r);
  // Every (unique id, table) pair some position selected is gathered exactly once, no other.
  std::set<std::pair<int32_t, int32_t>> need;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < hp.K; ++k) need.insert({ids[n], A.sel[n * hp.K + k]});
  EXPECT_EQ(A.slot_u.size(), need.size());
  EXPECT_LE(A.slot_u.size(), static_cast<size_t>(N * hp.K));
  // Aux by hand: lambda * n_e * sum_i p_i f_i.
  double by_hand = 0;
  for (int64_t i = 0; i < hp.n_e; ++i) by_hand += (A.prob_sum[i] / N) * (A.load[i] / (N * hp.K));
  EXPECT_NEAR(A.aux, hp.lambda * hp.n_e * by_hand, 1e-12);
  double loads = 0;
  for (double x : A.load) loads += x;
  EXPECT_EQ(loads, static_cast<double>(N * hp.K));

  const float aux_grad = 0.8f;
  std::vector<float> da(N * d, 0.f), dR(hp.n_e * d, 0.f), ds(d, 0.f), dar(N * d, 0.f), dRr(hp.n_e * d, 0.f),
      dsr(d, 0.f);
  std::vector<SparseRowGrad> gE(static_cast<size_t>(hp.n_e));
  for (auto& g : gE) g.init(V, d);
  std::vector<std::vector<float>> dEr(static_cast<size_t>(hp.n_e), std::vector<float>(V * d, 0.f));
  jtokm_backward(da.data(), dR.data(), ds.data(), gE.data(), A, dh.data(), a.data(), R.data(), s.data(), rb, N, d, hp,
                 aux_grad);
  jtokm_backward_ref(dar.data(), dRr.data(), dsr.data(), dEr, dh.data(), a.data(), R.data(), s.data(), E.data(),
                     ids.data(), N, d, hp, aux_grad);
  EXPECT_LT(rel_err(da, dar), 1e-5);
  EXPECT_LT(rel_err(dR, dRr), 1e-5);
  EXPECT_LT(rel_err(ds, dsr), 1e-5);
  for (int64_t i = 0; i < hp.n_e; ++i) {
    EXPECT_LT(rel_err(densify(gE[i], V), dEr[i]), 1e-5) << "table " << i;
    // Row-sparse: only ids that selected table i have a row.
    std::set<int32_t> want;
    for (auto& [id, t] : need)
      if (t == i) want.insert(id);
    EXPECT_EQ(std::set<int32_t>(gE[i].ids.begin(), gE[i].ids.end()), want) << "table " << i;
  }

  // Finite differences of sum(h * dh) + aux_grad * aux through the reference (routing fixed by
  // the small step; the seeds keep every top-K margin far above it).
  auto f = [&] {
    std::fill(hr.begin(), hr.end(), 0.0f);  // (the output's offset only adds rounding noise)
    double aux = jtokm_forward_ref(hr.data(), a.data(), R.data(), s.data(), E.data(), ids.data(), N, d, hp);
    return dot(hr, dh) + aux_grad * aux;
  };
  EXPECT_LT(rel_err(dsr, numeric_grad(s, f, 1e-3f)), 2e-3);
  EXPECT_LT(rel_err(dRr, numeric_grad(R, f, 1e-3f)), 5e-3);
  EXPECT_LT(rel_err(dar, numeric_grad(a, f, 1e-3f)), 5e-3);
  for (int64_t i = 0; i < hp.n_e; ++i) EXPECT_LT(rel_err(dEr[i], numeric_grad(E[i].mutable_values(), f, 1e-3f)), 5e-3) << "table " << i;
}

INSTANTIATE_TEST_SUITE_P(Variants, JTokMLayer,
                         ::testing::Values(JmCase{true, true, 5, 2}, JmCase{false, false, 5, 2}, JmCase{true, false, 4, 1},
                                           JmCase{true, true, 3, 3}));

TEST(JTokMLayer, ZeroTablesDoNotProduceNaN) {
  const int64_t N = 4, d = 4, V = 3;
  JTokMHyper hp;
  hp.n_e = 3;
  hp.K = 2;
  std::vector<TokenTable> E(3);
  for (auto& t : E) t = TokenTable::in_ram(V, d);
  std::vector<int32_t> ids = {0, 1, 0, 2};
  auto a = randn(N * d, 1), R = randn(3 * d, 2), s = randn(d, 3), dh = randn(N * d, 4);
  RowBatch rb = dedup_ids(ids.data(), N, V);
  JTokMActs A;
  std::vector<float> h(N * d, 0.f), da(N * d, 0.f), dR(3 * d, 0.f), ds(d, 0.f);
  jtokm_forward(h.data(), A, a.data(), R.data(), s.data(), E.data(), rb, N, d, hp);
  std::vector<SparseRowGrad> g(3);
  for (auto& x : g) x.init(V, d);
  jtokm_backward(da.data(), dR.data(), ds.data(), g.data(), A, dh.data(), a.data(), R.data(), s.data(), rb, N, d, hp, 1.0f);
  for (float x : h) EXPECT_EQ(x, 0.0f);
  for (auto& x : g)
    for (float v : x.rows) EXPECT_TRUE(std::isfinite(v));
  for (float v : dR) EXPECT_TRUE(std::isfinite(v));
}
