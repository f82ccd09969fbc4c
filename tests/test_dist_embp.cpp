// src/dist/embedding_parallel: sharded token-indexed tables and their exchanges, checked against
// the whole tables held locally. ctest runs it alone (a world of one: every exchange is with
// itself); tests/test_dist_comm.sh runs it under `mpirun -np 2`. Every rank can regenerate every
// rank's batch (seeded by rank), so each computes the expected result of the whole exchange.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "dist/communicator.h"
#include "dist/embedding_parallel.h"
#include "dist/embp_plan.h"
#include "dist/sharded_tables.h"
#include "model/transformer.h"
#include "train/optimizer.h"

using namespace jtok;
using dist::RowOwner;

namespace {

struct DistEnv : ::testing::Environment {
  void SetUp() override { dist::init(nullptr, nullptr); }
  void TearDown() override { dist::finalize(); }
};
const auto* env = ::testing::AddGlobalTestEnvironment(new DistEnv);

constexpr int64_t V = 53, d = 8, NE = 3, K = 2, N = 40;

std::vector<std::vector<float>> full_tables() {
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<float>> t(NE, std::vector<float>(V * d));
  for (auto& x : t)
    for (auto& v : x) v = nd(g);
  return t;
}

// Rank r's micro-batch: Zipf-like ids (repeats, as real text), K distinct tables, weights summing to 1.
struct RankBatch {
  std::vector<int32_t> ids, sel;
  std::vector<float> w, de;
};
RankBatch batch_of(int r) {
  std::mt19937 g(100u + static_cast<unsigned>(r));
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  RankBatch b;
  for (int64_t n = 0; n < N; ++n) {
    b.ids.push_back(static_cast<int32_t>(std::min<double>(V - 1, std::floor(std::pow(u(g), 3.0) * V))));
    const int32_t a = static_cast<int32_t>(g() % NE), c = static_cast<int32_t>((a + 1 + g() % (NE - 1)) % NE);
    b.sel.push_back(a);
    b.sel.push_back(c);
    const float w0 = 0.2f + 0.6f * u(g);
    b.w.push_back(w0);
    b.w.push_back(1.0f - w0);
  }
  for (int64_t i = 0; i < N * d; ++i) b.de.push_back(nd(g));
  return b;
}

void expect_close(const float* a, const float* b, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(a[i], b[i], 1e-6f * (1.0f + std::fabs(b[i]))) << what << " element " << i;
}

std::vector<const float*> ptrs(const std::vector<std::vector<float>>& t) {
  std::vector<const float*> p;
  for (const auto& x : t) p.push_back(x.data());
  return p;
}

}  // namespace

// Rows per rank: every id has one owner, no rank holds more than ceil(V/P) rows, and a rank's
// table + AdamW moment bytes are rows_on(rank)/V of the single process's (ceil(V/P)/V at most).
TEST(DistEmbP, OwnershipAndShardBytes) {
  for (auto kind : {RowOwner::kModP, RowOwner::kContiguous})
    for (int64_t P = 1; P <= 8; ++P) {
      RowOwner own{V, P, kind};
      std::vector<int64_t> seen(P, 0);
      for (int64_t id = 0; id < V; ++id) {
        const int o = own.owner(id);
        ASSERT_TRUE(o >= 0 && o < P);
        ASSERT_LT(own.local(id), own.rows_on(o));
        ASSERT_EQ(own.global(o, own.local(id)), id);
        ++seen[o];
      }
      int64_t mx = 0;
      for (int r = 0; r < P; ++r) {
        EXPECT_EQ(seen[r], own.rows_on(r));
        mx = std::max(mx, seen[r]);
      }
      EXPECT_EQ(mx, (V + P - 1) / P);
    }
  const int P = dist::world_size(), me = dist::rank();
  dist::TableShard s = dist::make_shard({V, P}, me, NE, d);
  const int64_t single = NE * V * d * 4;  // one process's tables (bytes)
  EXPECT_EQ(s.table_bytes(), NE * (RowOwner{V, P}.rows_on(me)) * d * 4);
  EXPECT_LE(s.table_bytes() * V, single * ((V + P - 1) / P));  // <= ceil(V/P)/V of the whole
  if (me == 0) {
    EXPECT_EQ(s.table_bytes() * V, single * ((V + P - 1) / P));
  }
  std::printf("rank %d of %d: shard %lld table bytes (single process: %lld)\n", me, P,
              static_cast<long long>(s.table_bytes()), static_cast<long long>(single));
}

TEST(DistEmbP, FetchRowsAndPushGrads) {
  const int P = dist::world_size(), me = dist::rank();
  const auto full = full_tables();
  for (auto kind : {RowOwner::kModP, RowOwner::kContiguous}) {
    RowOwner own{V, P, kind};
    dist::TableShard s = dist::make_shard(own, me, NE, d, ptrs(full));
    const RankBatch b = batch_of(me);
    const RowBatch rb = dedup_ids(b.ids.data(), N, V);
    const int64_t U = static_cast<int64_t>(rb.unique.size());
    std::vector<float> rows(U * d, -1.0f);
    dist::TableBytes fb = dist::fetch_rows(rows.data(), s, 1, rb);
    for (int64_t u = 0; u < U; ++u) expect_close(rows.data() + u * d, full[1].data() + rb.unique[u] * d, d, "fetched row");
    // Gradient rows: row u of rank r is (r + 1) * (id + 1) * 0.01 + j.
    auto grows_of = [&](int r, const RowBatch& rbr) {
      std::vector<float> g(rbr.unique.size() * d);
      for (size_t u = 0; u < rbr.unique.size(); ++u)
        for (int64_t j = 0; j < d; ++j) g[u * d + j] = (r + 1) * (rbr.unique[u] + 1) * 0.01f + static_cast<float>(j);
      return g;
    };
    dist::TableBytes gb = dist::push_row_grads(s, 1, rb, grows_of(me, rb).data());
    // Expected: every rank's contributions to my rows, in rank order.
    std::vector<float> want(V * d, 0.0f);
    std::vector<char> has(V, 0);
    for (int r = 0; r < P; ++r) {
      const RankBatch br = batch_of(r);
      const RowBatch rbr = dedup_ids(br.ids.data(), N, V);
      const auto g = grows_of(r, rbr);
      for (size_t u = 0; u < rbr.unique.size(); ++u) {
        if (own.owner(rbr.unique[u]) != me) continue;
        has[rbr.unique[u]] = 1;
        for (int64_t j = 0; j < d; ++j) want[rbr.unique[u] * d + j] += g[u * d + j];
      }
    }
    int64_t nrows = 0;
    for (int64_t id = 0; id < V; ++id) {
      if (!has[id]) continue;
      ++nrows;
      const int32_t slot = s.grads[1].slot[own.local(id)];
      ASSERT_GE(slot, 0) << "id " << id;
      expect_close(s.grads[1].rows.data() + slot * d, want.data() + id * d, d, "pushed gradient");
    }
    EXPECT_EQ(static_cast<int64_t>(s.grads[1].ids.size()), nrows);
    EXPECT_TRUE(s.grads[0].ids.empty() && s.grads[2].ids.empty());
    // Byte counters: 4 + 4d per remote unique id (request + row), 4 + 4d per pushed gradient row.
    int64_t remote = 0, remote_in = 0;
    for (int64_t u = 0; u < U; ++u) remote += own.owner(rb.unique[u]) != me;
    for (int r = 0; r < P; ++r) {
      if (r == me) continue;
      const RankBatch br = batch_of(r);
      const RowBatch rbr = dedup_ids(br.ids.data(), N, V);
      for (int32_t id : rbr.unique) remote_in += own.owner(id) == me;
    }
    EXPECT_EQ(fb.sent, remote * 4 + remote_in * 4 * d);
    EXPECT_EQ(fb.recv, remote_in * 4 + remote * 4 * d);
    EXPECT_EQ(gb.sent, remote * (4 + 4 * d));
    EXPECT_EQ(gb.recv, remote_in * (4 + 4 * d));
  }
}

// Owner-rank premixing against mixing the whole tables locally; the naive exchange of (id, table)
// rows against the same rows; the byte counters against the formulas of the header.
TEST(DistEmbP, PremixAndNaive) {
  const int P = dist::world_size(), me = dist::rank();
  const auto full = full_tables();
  RowOwner own{V, P};
  dist::TableShard s = dist::make_shard(own, me, NE, d, ptrs(full));
  const RankBatch b = batch_of(me);
  std::vector<float> e(N * d, -1.0f), dw(N * K, -1.0f);
  dist::PremixState st;
  const dist::TableBytes fwd = dist::premix_forward(e.data(), st, s, b.ids.data(), b.sel.data(), b.w.data(), N, K);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<float> want(d, 0.0f);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < d; ++j) want[j] += b.w[n * K + k] * full[b.sel[n * K + k]][b.ids[n] * d + j];
    expect_close(e.data() + n * d, want.data(), d, "premixed vector");
  }
  const dist::TableBytes bwd = dist::premix_backward(dw.data(), s, st, b.de.data());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      double want = 0;
      for (int64_t j = 0; j < d; ++j) want += static_cast<double>(b.de[n * d + j]) * full[b.sel[n * K + k]][b.ids[n] * d + j];
      ASSERT_NEAR(dw[n * K + k], want, 1e-5 * (1 + std::fabs(want))) << "dw position " << n << " k " << k;
    }
  // Row gradients at the owners: sum over every rank's positions (rank order) of w_k de.
  std::vector<std::vector<double>> want(NE, std::vector<double>(V * d, 0.0));
  int64_t remote_pos = 0, remote_pos_in = 0;
  for (int r = 0; r < P; ++r) {
    const RankBatch br = batch_of(r);
    for (int64_t n = 0; n < N; ++n) {
      const int o = own.owner(br.ids[n]);
      if (r == me && o != me) ++remote_pos;
      if (r != me && o == me) ++remote_pos_in;
      if (o != me) continue;
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < d; ++j) want[br.sel[n * K + k]][br.ids[n] * d + j] += static_cast<double>(br.w[n * K + k]) * br.de[n * d + j];
    }
  }
  for (int64_t t = 0; t < NE; ++t)
    for (int64_t id = 0; id < V; ++id) {
      if (own.owner(id) != me) continue;
      const int32_t slot = s.grads[t].slot[own.local(id)];
      for (int64_t j = 0; j < d; ++j) {
        const double got = slot >= 0 ? s.grads[t].rows[slot * d + j] : 0.0;
        ASSERT_NEAR(got, want[t][id * d + j], 1e-5 * (1 + std::fabs(want[t][id * d + j]))) << "table " << t << " id " << id;
      }
    }
  // Premix bytes: (4 + 8K) request + 4d reply per remote position forward; 4d + 4K backward.
  EXPECT_EQ(fwd.sent, remote_pos * (4 + 8 * K) + remote_pos_in * 4 * d);
  EXPECT_EQ(fwd.recv, remote_pos_in * (4 + 8 * K) + remote_pos * 4 * d);
  EXPECT_EQ(bwd.sent, remote_pos * 4 * d + remote_pos_in * 4 * K);
  EXPECT_EQ(bwd.recv, remote_pos_in * 4 * d + remote_pos * 4 * K);

  // Naive: the unique (id, table) pairs the positions selected, raw rows back.
  auto pairs_of = [&](const RankBatch& br, std::vector<int32_t>& pid, std::vector<int32_t>& ptab) {
    std::vector<char> seen(V * NE, 0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t key = br.ids[n] * NE + br.sel[n * K + k];
        if (seen[key]) continue;
        seen[key] = 1;
        pid.push_back(br.ids[n]);
        ptab.push_back(br.sel[n * K + k]);
      }
  };
  std::vector<int32_t> pid, ptab;
  pairs_of(b, pid, ptab);
  std::vector<float> rows(pid.size() * d);
  const dist::TableBytes nb = dist::naive_fetch(rows.data(), s, pid, ptab);
  int64_t remote_pairs = 0, remote_pairs_in = 0;
  for (size_t q = 0; q < pid.size(); ++q) {
    expect_close(rows.data() + q * d, full[ptab[q]].data() + pid[q] * d, d, "naive row");
    remote_pairs += own.owner(pid[q]) != me;
  }
  for (int r = 0; r < P; ++r) {
    if (r == me) continue;
    std::vector<int32_t> ri, rt;
    pairs_of(batch_of(r), ri, rt);
    for (int32_t id : ri) remote_pairs_in += own.owner(id) == me;
  }
  // 8 B request (id, table) + 4d B row per remote pair.
  EXPECT_EQ(nb.sent, remote_pairs * 8 + remote_pairs_in * 4 * d);
  EXPECT_EQ(nb.recv, remote_pairs_in * 8 + remote_pairs * 4 * d);
  // Gradients of the pairs back to the owners: (8 + 4d) B per remote pair.
  std::vector<float> pg(pid.size() * d, 0.5f);
  const dist::TableBytes pb = dist::push_pair_grads(s, pid, ptab, pg.data());
  EXPECT_EQ(pb.sent, remote_pairs * (8 + 4 * d));
  EXPECT_EQ(pb.recv, remote_pairs_in * (8 + 4 * d));
  std::printf("rank %d: premix fwd %lld/%lld B, bwd %lld/%lld B; naive %lld/%lld B (%lld remote pairs)\n", me,
              static_cast<long long>(fwd.sent), static_cast<long long>(fwd.recv), static_cast<long long>(bwd.sent),
              static_cast<long long>(bwd.recv), static_cast<long long>(nb.sent), static_cast<long long>(nb.recv),
              static_cast<long long>(remote_pairs));
}

// The planner's formulas (jtok embp-plan) give what the exchanges measure, rank by rank.
TEST(DistEmbP, PlannerFormulasEqualMeasured) {
  const int P = dist::world_size(), me = dist::rank();
  const auto full = full_tables();
  for (auto kind : {RowOwner::kModP, RowOwner::kContiguous}) {
    RowOwner own{V, P, kind};
    dist::TableShard s = dist::make_shard(own, me, NE, d, ptrs(full));
    std::vector<std::vector<int32_t>> ids(P), sel(P);
    for (int r = 0; r < P; ++r) {
      ids[r] = batch_of(r).ids;
      sel[r] = batch_of(r).sel;
    }
    const RankBatch b = batch_of(me);
    // JTok: fetch + push.
    const RowBatch rb = dedup_ids(b.ids.data(), N, V);
    std::vector<float> rows(rb.unique.size() * d), g(rb.unique.size() * d, 1.0f);
    dist::TableBytes j = dist::fetch_rows(rows.data(), s, 0, rb);
    j.add(dist::push_row_grads(s, 0, rb, g.data()));
    const auto pj = dist::plan_jtok(ids, own, d);
    EXPECT_EQ(j.sent, pj[me].sent);
    EXPECT_EQ(j.recv, pj[me].recv);
    // Premix: forward + backward.
    std::vector<float> e(N * d), dw(N * K);
    dist::PremixState st;
    dist::TableBytes pm = dist::premix_forward(e.data(), st, s, b.ids.data(), b.sel.data(), b.w.data(), N, K);
    pm.add(dist::premix_backward(dw.data(), s, st, b.de.data()));
    const auto pp = dist::plan_premix(ids, own, K, d);
    EXPECT_EQ(pm.sent, pp[me].sent);
    EXPECT_EQ(pm.recv, pp[me].recv);
    // Naive: the unique pairs, fetch + gradient push.
    std::vector<int32_t> pid, ptab;
    std::vector<char> seen(V * NE, 0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        if (!seen[b.ids[n] * NE + b.sel[n * K + k]]++) pid.push_back(b.ids[n]), ptab.push_back(b.sel[n * K + k]);
    std::vector<float> prow(pid.size() * d), pg(pid.size() * d, 1.0f);
    dist::TableBytes nv = dist::naive_fetch(prow.data(), s, pid, ptab);
    nv.add(dist::push_pair_grads(s, pid, ptab, pg.data()));
    const auto pn = dist::plan_naive(ids, sel, own, K, d);
    EXPECT_EQ(nv.sent, pn[me].sent);
    EXPECT_EQ(nv.recv, pn[me].recv);
    // Premix with dedup never costs more than either.
    const auto pd = dist::plan_premix_dedup(ids, sel, own, K, d);
    EXPECT_LE(pd[me].sent + pd[me].recv, std::min(pp[me].sent + pp[me].recv, pn[me].sent + pn[me].recv));
  }
}

// dist::ShardedTables, the trainer's provider, in each mode, with its exchanges posted (split as the
// model calls them: mix_post after the router, mix at the write-back, mix_backward_post, then
// mix_backward) and blocking (--embp-overlap off): the mixed vectors and dL/dw are the whole
// tables', the owners' gradients sum to the whole tables' gradient, posted equals blocking bit for
// bit, and the bytes are the planner's formulas, premix-dedup's (the paper's EmbP + Dedup: per id the
// cheaper of premixing and fetching rows) included; it never moves more than premix or naive.
TEST(DistEmbP, ShardedTablesModesPostedBlockingAndPlanner) {
  const int P = dist::world_size(), me = dist::rank();
  ModelConfig c;
  c.vocab_size = V;
  c.hidden_size = d;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.intermediate_size = 16;
  c.max_position_embeddings = 16;
  c.jtokm = true;
  c.jtokm_n_e = NE;
  c.jtokm_top_k = K;
  c.jtokm_init_std = 1.0;
  const Model ref = make_model(c, 5);
  const int64_t base = ref.jtokm_table[0];
  const RowOwner own{c.padded_vocab(), P, RowOwner::kModP};
  std::vector<std::vector<int32_t>> ids(P), sel(P);
  for (int r = 0; r < P; ++r) ids[r] = batch_of(r).ids, sel[r] = batch_of(r).sel;
  const RankBatch b = batch_of(me);
  // The whole tables' answers: e, dL/dw, and the sum of squares of every rank's row gradients.
  auto row = [&](int64_t t, int32_t id) { return ref.tables[static_cast<size_t>(base + t)].row(id); };
  std::vector<double> gsum(static_cast<size_t>(NE * own.V * d), 0.0);
  for (int r = 0; r < P; ++r) {
    const RankBatch br = batch_of(r);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < d; ++j)
          gsum[static_cast<size_t>((br.sel[n * K + k] * own.V + br.ids[n]) * d + j)] += br.w[n * K + k] * br.de[n * d + j];
  }
  double want_ss = 0;
  for (double g : gsum) want_ss += g * g;
  struct Out {
    std::vector<float> e, dw;
    double ss = 0;
    dist::TableBytes bytes;
  };
  auto run = [&](const char* mode, bool overlap) {
    Model m = make_model(c, 5);
    dist::ShardedTables t(m, dist::ShardedTables::parse_mode(mode), RowOwner::kModP);
    t.set_overlap(overlap);
    Out o;
    o.e.assign(N * d, -1.0f);
    o.dw.assign(N * K, -1.0f);
    t.mix_post(base, b.ids.data(), b.sel.data(), b.w.data(), N, K);
    t.mix(o.e.data(), base, b.ids.data(), b.sel.data(), b.w.data(), N, K);
    t.mix_backward_post(base, b.de.data(), N, K);
    t.mix_backward(o.dw.data(), base, b.de.data(), N, K);
    o.ss = t.grad_sum_squares();
    o.bytes = t.take_bytes();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        double want_dw = 0;
        for (int64_t j = 0; j < d; ++j) want_dw += static_cast<double>(b.de[n * d + j]) * row(b.sel[n * K + k], b.ids[n])[j];
        EXPECT_NEAR(o.dw[n * K + k], want_dw, 1e-5 * (1 + std::fabs(want_dw))) << mode << " dw " << n << " " << k;
      }
    for (int64_t n = 0; n < N; ++n) {
      std::vector<float> want(d, 0.0f);
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < d; ++j) want[j] += b.w[n * K + k] * row(b.sel[n * K + k], b.ids[n])[j];
      expect_close(o.e.data() + n * d, want.data(), d, mode);
    }
    EXPECT_NEAR(o.ss, want_ss, 1e-5 * want_ss) << mode;
    return o;
  };
  const auto pp = dist::plan_premix(ids, own, K, d), pn = dist::plan_naive(ids, sel, own, K, d);
  const auto pd = dist::plan_premix_dedup(ids, sel, own, K, d);
  for (const char* mode : {"premix", "naive", "premix-dedup"}) {
    const Out on = run(mode, true), off = run(mode, false);
    EXPECT_EQ(on.e, off.e) << mode << ": posted and blocking mixed vectors differ";
    EXPECT_EQ(on.dw, off.dw) << mode;
    EXPECT_EQ(on.ss, off.ss) << mode;
    EXPECT_EQ(on.bytes.sent, off.bytes.sent) << mode;
    EXPECT_EQ(on.bytes.recv, off.bytes.recv) << mode;
    const auto& plan = std::string(mode) == "premix" ? pp : std::string(mode) == "naive" ? pn : pd;
    EXPECT_EQ(on.bytes.sent, plan[me].sent) << mode;
    EXPECT_EQ(on.bytes.recv, plan[me].recv) << mode;
    std::printf("rank %d %s: sent %lld recv %lld bytes\n", me, mode, static_cast<long long>(on.bytes.sent),
                static_cast<long long>(on.bytes.recv));
  }
  if (P > 1) {  // both kinds of ids occur in this batch: dedup strictly below each pure mode
    EXPECT_LT(pd[me].sent + pd[me].recv, pp[me].sent + pp[me].recv);
    EXPECT_LT(pd[me].sent + pd[me].recv, pn[me].sent + pn[me].recv);
  }
}
