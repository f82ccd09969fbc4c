// JTok: deduplication, the gate's fast path against its per-position reference, finite
// differences through the gate, and the table AdamW's dense semantics.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>

#include "core/error.h"
#include "core/parallel.h"
#include "model/jtok.h"
#include "model/token_table.h"
#include "op_test_util.h"
#include "ops/lowp_convert.h"

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

static std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
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

// A decoding step gathers one row per sequence: an OpenMP fork/join per JTok layer cost far more
// than the rows (11 % of batch-1 decode on 2 threads). Below kParallelMin elements the gather runs
// on the calling thread; a training micro-batch's stays parallel. Either way the rows are the
// reference's.
TEST(TokenTableGather, DecodingStepIsSerialTrainingBatchIsParallel) {
  const int64_t V = 300, d = 768;
  TokenTable E = TokenTable::in_ram(V, d, randn(V * d, 11, 0.5f));
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  for (int64_t N : {int64_t{1}, int64_t{16}, int64_t{64}}) {
    std::vector<int32_t> ids(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) ids[n] = static_cast<int32_t>((n * 37) % V);
    RowBatch rb = dedup_ids(ids.data(), N, V);
    const int64_t U = static_cast<int64_t>(rb.unique.size());
    ASSERT_EQ(U, N);
    std::vector<int> in_parallel(static_cast<size_t>(U), -1);
    RowSync sync = [&](int64_t, int64_t row) {
      for (int64_t u = 0; u < U; ++u)
        if (rb.unique[u] == row) in_parallel[u] = omp_in_parallel() ? 1 : 0;
    };
    JTokActs a;
    jtok_prepare(a, E, rb, 1e-6f, true, sync, 0);
    std::vector<float> ref(static_cast<size_t>(U * d));
    gather_unique_rows_ref(ref.data(), E, rb);
    EXPECT_EQ(a.rows, ref) << "N " << N;
    const int expect = U * d >= kParallelMin ? 1 : 0;
    for (int64_t u = 0; u < U; ++u) EXPECT_EQ(in_parallel[u], expect) << "N " << N << " row " << u;
  }
  EXPECT_LT(16 * d, kParallelMin);  // batch-16 decoding at config b's width stays serial
  EXPECT_GE(64 * d, kParallelMin);
  omp_set_num_threads(saved);
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

// bf16 / int8 tables: the fast dequantizing gather equals the plain reference bit for bit, over
// RAM and view storage; the quantization error stays within its bound (bf16: half an ulp of 8
// significand bits, relative 2^-8; int8: half a step, scale / 2); quantized tables refuse writes and
// the f32-only accessors.
TEST(TokenTableDtype, DequantizingGatherMatchesReferenceWithinQuantizationBounds) {
  const int64_t V = 40, d = 37;  // d odd: no vector-width assumption
  std::vector<float> x = randn(V * d, 5, 1.0f);
  for (int64_t r = 0; r < V; ++r)
    for (int64_t j = 0; j < d; ++j) x[r * d + j] *= std::pow(2.0f, static_cast<float>(r % 9) - 4.0f);  // rows of 2^-4 .. 2^4
  for (int64_t j = 0; j < d; ++j) x[7 * d + j] = 0.0f;  // an all-zero row: scale 0
  x[3 * d] = 1.00390625f;  // bf16 halfway between 1 and 1 + 2^-7: ties to even, 1
  x[3 * d + 1] = 1.01171875f;  // halfway between 1 + 2^-7 and 1 + 2^-6: ties to even, 1 + 2^-6
  const TokenTable f32 = TokenTable::in_ram(V, d, x);
  std::vector<int32_t> ids = zipf_ids(64, V, 9);
  for (int32_t i = 0; i < V; i += 3) ids.push_back(i);
  const RowBatch rb = dedup_ids(ids.data(), static_cast<int64_t>(ids.size()), V);
  const int64_t U = static_cast<int64_t>(rb.unique.size());
  for (Dtype dt : {Dtype::f32, Dtype::bf16, Dtype::int8}) {
    SCOPED_TRACE(dtype_name(dt));
    const TokenTable q = quantize_table(f32, dt);
    EXPECT_EQ(q.dtype(), dt);
    EXPECT_EQ(q.storage_bytes(), V * d * dtype_bytes(dt) + (dt == Dtype::int8 ? V * 4 : 0));
    // A view over a copy of the same bytes (as a mapped file holds them).
    auto owner = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(q.raw_row(0)),
                                                         static_cast<const uint8_t*>(q.raw_row(0)) + V * q.row_stride_bytes());
    auto sowner = std::make_shared<std::vector<float>>(dt == Dtype::int8 ? std::vector<float>(q.scales(), q.scales() + V)
                                                                             : std::vector<float>{});
    auto both = std::make_shared<std::pair<decltype(owner), decltype(sowner)>>(owner, sowner);
    const TokenTable v = TokenTable::view(V, d, dt, owner->data(), dt == Dtype::int8 ? sowner->data() : nullptr, both);
    std::vector<float> fast(static_cast<size_t>(U * d)), ref(fast.size()), viewed(fast.size());
    gather_unique_rows(fast.data(), q, rb);
    gather_unique_rows_ref(ref.data(), q, rb);
    gather_unique_rows(viewed.data(), v, rb);
    EXPECT_EQ(0, std::memcmp(fast.data(), ref.data(), sizeof(float) * fast.size()));
    EXPECT_EQ(0, std::memcmp(fast.data(), viewed.data(), sizeof(float) * fast.size()));
    std::vector<float> row(static_cast<size_t>(d)), row_ref(row.size());
    double worst = 0;  // error / bound, over every element
    for (int64_t r = 0; r < V; ++r) {
      q.read_row(r, row.data());
      q.read_row_ref(r, row_ref.data());
      ASSERT_EQ(0, std::memcmp(row.data(), row_ref.data(), sizeof(float) * d)) << "row " << r;
      float amax = 0;
      for (int64_t j = 0; j < d; ++j) amax = std::max(amax, std::abs(x[r * d + j]));
      for (int64_t j = 0; j < d; ++j) {
        const double e = std::abs(static_cast<double>(row[j]) - x[r * d + j]);
        const double bound = dt == Dtype::f32 ? 0.0 : dt == Dtype::bf16 ? std::ldexp(std::abs(x[r * d + j]), -8)
                                                                                 : amax / 127.0 / 2.0 * (1 + 1e-6);
        ASSERT_LE(e, bound) << "row " << r << " col " << j;
        if (bound > 0) worst = std::max(worst, e / bound);
      }
    }
    if (dt != Dtype::f32) {
      EXPECT_GT(worst, 0.5);  // the bound is tight: quantization did round
    }
    for (int64_t j = 0; j < d; ++j) EXPECT_EQ(q.to_vector()[7 * d + j], 0.0f);
    if (dt == Dtype::bf16) {
      EXPECT_EQ(q.to_vector()[3 * d], 1.0f);
      EXPECT_EQ(q.to_vector()[3 * d + 1], 1.015625f);
    }
    if (dt == Dtype::int8) {
      EXPECT_EQ(q.scales()[7], 0.0f);
      EXPECT_EQ(q.scales()[3], [&] { float a = 0; for (int64_t j = 0; j < d; ++j) a = std::max(a, std::abs(x[3 * d + j])); return a / 127.0f; }());
    }
    if (dt == Dtype::f32) continue;
    EXPECT_TRUE(q.read_only());
    EXPECT_NE(error_of([&] { TokenTable c = q; c.mutable_data(); }).find("cannot be trained"), std::string::npos);
    EXPECT_NE(error_of([&] { (void)q.data(); }).find(dtype_name(dt)), std::string::npos);
    EXPECT_THROW(quantize_table(q, Dtype::int8), Error);  // already quantized
    EXPECT_EQ(prefetch_rows(q, ids.data(), 4), 0);  // RAM: nothing to announce
    EXPECT_EQ(prefetch_rows(v, ids.data(), 4), 4);
  }
  EXPECT_EQ(parse_dtype("int8", "--x"), Dtype::int8);
  EXPECT_NE(error_of([] { parse_dtype("fp8", "--table-dtype"); }).find("'fp8'"), std::string::npos);
  EXPECT_THROW(TokenTable::quantized_in_ram(V, d, Dtype::int8, std::vector<uint8_t>(V * d), {}), Error);  // no scales
}

// The bf16 gather (a device's staging): every storage's f32 gather rounded to nearest even, bit for
// bit, a bf16 table's rows being its stored bits (RAM and a view); serial (few rows) and parallel
// (past kParallelMin values) alike; an id the table does not hold refused by name.
TEST(TokenTableGather, Bf16GatherIsTheF32GatherRounded) {
  const int64_t V = 300, d = 96;
  const TokenTable f32 = TokenTable::in_ram(V, d, randn(V * d, 13, 0.7f));
  for (Dtype dt : {Dtype::f32, Dtype::bf16, Dtype::int8, Dtype::int4}) {
    SCOPED_TRACE(dtype_name(dt));
    const TokenTable q = dt == Dtype::f32 ? f32 : quantize_table(f32, dt);
    std::vector<TokenTable> tables = {q};
    if (dt == Dtype::bf16) {  // a view over a copy of its bytes, as a mapped file holds them
      auto owner =
          std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(q.raw_row(0)),
                                                 static_cast<const uint8_t*>(q.raw_row(0)) + V * q.row_stride_bytes());
      tables.push_back(TokenTable::view(V, d, dt, owner->data(), nullptr, owner));
    }
    for (const TokenTable& t : tables)
      for (int64_t n : {int64_t{3}, int64_t{250}}) {  // 3 x 96 serial, 250 x 96 past kParallelMin
        const std::vector<int32_t> ids = zipf_ids(n, V, 21);
        std::vector<float> rows(static_cast<size_t>(n * d));
        gather_rows_ref(rows.data(), t, ids.data(), n);
        std::vector<uint16_t> want(rows.size()), got(rows.size());
        for (size_t i = 0; i < rows.size(); ++i) want[i] = f32_to_bf16(rows[i]);
        gather_rows_bf16(got.data(), t, ids.data(), n);
        EXPECT_EQ(got, want) << "n " << n << (t.is_view() ? " (view)" : "");
        if (dt == Dtype::bf16) {
          EXPECT_EQ(0, std::memcmp(got.data(), t.raw_row(ids[0]), sizeof(uint16_t) * d));  // the stored bits
        }
      }
  }
  EXPECT_GE(250 * d, kParallelMin);
  EXPECT_LT(3 * d, kParallelMin);
  const int32_t bad = static_cast<int32_t>(V);
  uint16_t out[96];
  EXPECT_NE(error_of([&] { gather_rows_bf16(out, f32, &bad, 1); }).find("id 300 is not held"), std::string::npos);
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

