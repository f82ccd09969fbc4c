// JTok: deduplication, the gate's fast path against its per-position reference, finite
// differences through the gate, and the table AdamW's dense semantics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <set>

#include "op_test_util.h"
#include "model/jtok.h"
#include "model/token_table.h"

using namespace jtok;
using namespace jtok::testing;

static std::vector<int32_t> zipf_ids(int64_t N, int64_t V, uint64_t seed) {
  // Few distinct ids, heavily repeated, as in real text.
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(N);
  for (auto& x : ids) x = static_cast<int32_t>((rng() % 7) * (rng() % 3) % V);
  ids[0] = static_cast<int32_t>(V - 1);
  return ids;
}

static TokenTable random_table(int64_t V, int64_t d, uint64_t seed) {
  return TokenTable::in_ram(V, d, randn(V * d, seed, 0.5f));
}

TEST(Dedup, UniqueSortedInverseAndPositions) {
  std::vector<int32_t> ids = {5, 3, 5, 9, 3, 3, 0};
  RowBatch rb = dedup_ids(ids.data(), 7, 10);
  EXPECT_EQ(rb.unique, (std::vector<int32_t>{0, 3, 5, 9}));
  for (size_t n = 0; n < ids.size(); ++n) EXPECT_EQ(rb.unique[rb.inverse[n]], ids[n]);
  ASSERT_EQ(rb.offsets.size(), 5u);
  for (size_t u = 0; u < rb.unique.size(); ++u)
    for (int32_t i = rb.offsets[u]; i < rb.offsets[u + 1]; ++i) EXPECT_EQ(ids[rb.order[i]], rb.unique[u]);
  EXPECT_EQ(rb.offsets[2] - rb.offsets[1], 3);  // id 3 at three positions
  EXPECT_THROW(dedup_ids(ids.data(), 7, 9), std::exception);  // id 9 outside 9 rows
}

TEST(TokenTableView, ReadOnlyViewGathersLikeRamAndRefusesWrites) {
  const int64_t V = 12, d = 5;
  TokenTable ram = random_table(V, d, 3);
  auto owner = std::make_shared<std::vector<float>>(ram.to_vector());
  TokenTable view = TokenTable::view(V, d, owner->data(), owner);
  EXPECT_FALSE(ram.read_only());
  EXPECT_TRUE(view.read_only());
  EXPECT_EQ(view.data(), owner->data());  // read in place, no copy
  std::vector<int32_t> ids = {4, 11, 4, 0};
  RowBatch rb = dedup_ids(ids.data(), 4, V);
  std::vector<float> a(rb.unique.size() * d), b(a.size());
  gather_unique_rows(a.data(), ram, rb);
  gather_unique_rows(b.data(), view, rb);
  EXPECT_EQ(a, b);
  for (size_t u = 0; u < rb.unique.size(); ++u)
    EXPECT_EQ(0, std::memcmp(a.data() + u * d, ram.row(rb.unique[u]), sizeof(float) * d));
  EXPECT_THROW(view.mutable_data(), std::exception);
  // Prefetch is a hint: views announce their rows, RAM tables nothing; no value changes.
  EXPECT_EQ(prefetch_rows(ram, ids.data(), 4), 0);
  EXPECT_EQ(prefetch_rows(view, ids.data(), 4), 4);
  EXPECT_EQ(view.to_vector(), ram.to_vector());
  const int32_t bad_id = static_cast<int32_t>(V);
  EXPECT_THROW(prefetch_rows(view, &bad_id, 1), std::exception);
  TokenTable copy = view;  // shares the owner, stays read-only
  EXPECT_TRUE(copy.read_only());
  EXPECT_EQ(copy.data(), view.data());
  TokenTable deep = ram;   // a RAM table copies its rows
  deep.mutable_row(2)[0] += 1.0f;
  EXPECT_NE(deep.row(2)[0], ram.row(2)[0]);
  EXPECT_THROW(TokenTable::in_ram(V, d, std::vector<float>(3)), std::exception);
}

class JTokGate : public ::testing::TestWithParam<bool> {};

TEST_P(JTokGate, FastMatchesReferenceAndFiniteDifferences) {
  const bool norm = GetParam();
  const int64_t N = 24, d = 12, V = 17;
  const float eps = 1e-6f;
  auto ids = zipf_ids(N, V, 1);
  TokenTable E = random_table(V, d, 2);
  auto s = randn(d, 3), hmid = randn(N * d, 4), mlp = randn(N * d, 5), dh = randn(N * d, 6);
  RowBatch rb = dedup_ids(ids.data(), N, V);
  ASSERT_LT(rb.unique.size(), static_cast<size_t>(N / 2));  // deduplication matters here
  JTokActs a;
  a.mlp_out = mlp;
  jtok_prepare(a, E, rb, eps, norm);
  std::vector<float> h(N * d), hr(N * d);
  jtok_forward(h.data(), hmid.data(), a, s.data(), rb, N, d);
  jtok_forward_ref(hr.data(), hmid.data(), mlp.data(), s.data(), E, ids.data(), N, d, eps, norm);
  EXPECT_LT(rel_err(h, hr), 1e-6);

  std::vector<float> dmlp(N * d), dmlpr(N * d), ds(d, 0.f), dsr(d, 0.f), dEr(V * d, 0.f);
  SparseRowGrad gE;
  gE.init(V, d);
  jtok_backward(dmlp.data(), ds.data(), gE, dh.data(), a, s.data(), rb, N, d, norm);
  jtok_backward_ref(dmlpr.data(), dsr.data(), dEr.data(), dh.data(), mlp.data(), s.data(), E, ids.data(), N, d, eps, norm);
  EXPECT_LT(rel_err(dmlp, dmlpr), 1e-6);
  EXPECT_LT(rel_err(ds, dsr), 1e-5);
  EXPECT_LT(rel_err(densify(gE, V), dEr), 1e-5);
  // Row-sparse: exactly the batch's distinct ids carry a gradient row.
  EXPECT_EQ(std::set<int32_t>(gE.ids.begin(), gE.ids.end()), std::set<int32_t>(rb.unique.begin(), rb.unique.end()));

  // Finite differences of sum(h_next * dh) through the reference.
  auto f = [&] {
    jtok_forward_ref(hr.data(), hmid.data(), mlp.data(), s.data(), E, ids.data(), N, d, eps, norm);
    return dot(hr, dh);
  };
  EXPECT_LT(rel_err(dsr, numeric_grad(s, f)), 2e-3);
  EXPECT_LT(rel_err(dmlpr, numeric_grad(mlp, f)), 2e-3);
  EXPECT_LT(rel_err(dEr, numeric_grad(E.mutable_values(), f, 1e-3f)), 5e-3);
}

INSTANTIATE_TEST_SUITE_P(NormAndAblation, JTokGate, ::testing::Values(true, false));

TEST(JTokGate, ZeroRowDoesNotProduceNaN) {
  const int64_t N = 3, d = 4, V = 2;
  TokenTable E;
  E = TokenTable::in_ram(V, d);
  std::vector<int32_t> ids = {0, 1, 0};
  auto s = randn(d, 1), dh = randn(N * d, 2);
  RowBatch rb = dedup_ids(ids.data(), N, V);
  JTokActs a;
  a.mlp_out = randn(N * d, 3);
  jtok_prepare(a, E, rb, 1e-6f, true);
  std::vector<float> dmlp(N * d), ds(d, 0.f);
  SparseRowGrad g;
  g.init(V, d);
  jtok_backward(dmlp.data(), ds.data(), g, dh.data(), a, s.data(), rb, N, d, true);
  for (float x : g.rows) EXPECT_TRUE(std::isfinite(x));
}

TEST(TableAdamW, DenseSemanticsMatchDenseAdamWOverSteps) {
  const int64_t V = 30, d = 8;
  TokenTable t = random_table(V, d, 7), tr = t;
  std::vector<float> m(V * d, 0.f), v(V * d, 0.f), mr = m, vr = v;
  SparseRowGrad g;
  g.init(V, d);
  for (int64_t step = 1; step <= 4; ++step) {
    g.clear();
    // A different, small set of rows each step: rows outside it still move (moment decay, wd).
    for (int32_t id : {static_cast<int32_t>(step), static_cast<int32_t>(2 * step + 3), 29}) {
      float* r = g.row(id);
      auto gr = randn(d, 100 + step * 31 + id);
      for (int64_t j = 0; j < d; ++j) r[j] += gr[j];
    }
    AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.7f};
    table_adamw_dense_semantics(t, m.data(), v.data(), g, h);
    table_adamw_ref(tr, mr.data(), vr.data(), g, h);
  }
  EXPECT_LT(rel_err(t.to_vector(), tr.to_vector()), 1e-6);
  EXPECT_LT(rel_err(m, mr), 1e-6);
  EXPECT_LT(rel_err(v, vr), 1e-6);
  // Row 20 never had a gradient after step 0 ... it had none at all: only weight decay moved it.
  auto orig = random_table(V, d, 7);
  for (int64_t j = 0; j < d; ++j) EXPECT_NEAR(t.values()[20 * d + j], orig.values()[20 * d + j] * std::pow(1 - 1e-3f, 4), 1e-6);
  // Row 1 had a gradient at step 1 only; afterwards its momentum keeps moving it.
  EXPECT_GT(std::abs(t.values()[1 * d] - orig.values()[1 * d] * std::pow(1 - 1e-3f, 4)), 1e-3);
}

TEST(TableAdamW, SparseRowsTouchOnlyRowsWithAGradientAndMatchDenseOnThem) {
  const int64_t V = 30, d = 8;
  TokenTable t = random_table(V, d, 7), td = t;
  std::vector<float> m(V * d, 0.f), v(V * d, 0.f), md = m, vd = v;
  SparseRowGrad g;
  g.init(V, d);
  const std::vector<int32_t> rows = {2, 5, 29};  // the same rows every step
  for (int64_t step = 1; step <= 3; ++step) {
    g.clear();
    for (int32_t id : rows) {
      float* r = g.row(id);
      auto gr = randn(d, 200 + step * 31 + id);
      for (int64_t j = 0; j < d; ++j) r[j] += gr[j];
    }
    AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.7f};
    table_adamw_sparse_rows(t, m.data(), v.data(), g, h);
    table_adamw_dense_semantics(td, md.data(), vd.data(), g, h);
  }
  auto orig = random_table(V, d, 7);
  for (int64_t r = 0; r < V; ++r) {
    const bool touched = std::find(rows.begin(), rows.end(), r) != rows.end();
    for (int64_t j = 0; j < d; ++j) {
      const int64_t i = r * d + j;
      if (touched) {  // a row with a gradient every step: exactly the dense update
        EXPECT_EQ(t.values()[i], td.values()[i]);
        EXPECT_EQ(m[i], md[i]);
        EXPECT_EQ(v[i], vd[i]);
      } else {        // untouched: no decay, no moments
        EXPECT_EQ(t.values()[i], orig.values()[i]);
        EXPECT_EQ(m[i], 0.0f);
        EXPECT_NE(td.values()[i], orig.values()[i]);  // (the dense semantics decayed it)
      }
    }
  }
}
