// The deferred dense-semantics table AdamW (optimizer_step with table_optimizer "dense",
// table_row_sync, sync_tables) against the eager pass over whole tables
// (table_adamw_eager): bit for bit, with rows that get a gradient at some steps, at
// every step, or never; rows brought current mid-way; the clipping coefficient and schedule of
// optimizer_step; and the checkpoint guard.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <limits>
#include <random>

#include "core/error.h"
#include "model/transformer.h"
#include "op_test_util.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/optimizer.h"
#include "train/schedule.h"
#include "train/table_optimizer.h"

using namespace jtok;
using jtok::testing::randn;
using jtok::testing::rel_err;

namespace {

Config small_with_tables() {
  Config c;
  c.model.vocab_size = 50; c.model.hidden_size = 16; c.model.num_hidden_layers = 2;
  c.model.num_attention_heads = 2; c.model.num_key_value_heads = 1; c.model.intermediate_size = 24;
  c.model.max_position_embeddings = 16;
  c.model.jtok = true; c.model.jtok_layers = "0";
  c.model.jtokm = true; c.model.jtokm_layers = "1"; c.model.jtokm_n_e = 3; c.model.jtokm_top_k = 2;
  c.train.seq_len = 8; c.train.max_steps = 12; c.train.warmup_steps = 2; c.train.learning_rate = 1e-2;
  c.train.weight_decay = 0.1; c.train.max_grad_norm = 0.5;  // clipping active: its coef matters too
  return c;
}

// Step s's gradient of table k: rows 0..4 every step, row 7 at steps 1 and 6 only, rows 10+s%5,
// 30+k at odd steps; every other row never (rows >= 40 never have one).
void set_table_grads(Model& m, int64_t s) {
  for (size_t k = 0; k < m.tables.size(); ++k) {
    SparseRowGrad& g = m.table_grads[k];
    g.clear();
    std::vector<int32_t> rows = {0, 1, 2, 3, 4, static_cast<int32_t>(10 + s % 5)};
    if (s == 1 || s == 6) rows.push_back(7);
    if (s % 2) rows.push_back(static_cast<int32_t>(30 + k));
    std::mt19937 rng(static_cast<uint32_t>(100 * s + k));
    std::normal_distribution<float> nd(0.0f, 0.3f);
    for (int32_t r : rows) {
      float* row = g.row(r);
      for (int64_t j = 0; j < g.dim; ++j) row[j] += nd(rng);
    }
  }
}

TokenTable random_table(int64_t V, int64_t d, uint64_t seed) { return TokenTable::in_ram(V, d, randn(V * d, seed, 0.5f)); }

bool bits_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

}  // namespace

TEST(DeferredTableAdamW, EqualsTheEagerDensePassBitForBit) {
  const Config cfg = small_with_tables();
  Model lazy = make_model(cfg.model, 5);
  Model eager = make_model(cfg.model, 5);
  ASSERT_EQ(lazy.tables.size(), 4u);
  AdamWState sl = make_adamw_state(lazy);
  AdamWState se = make_adamw_state(eager);
  bool deferred_seen = false;
  for (int64_t s = 0; s < cfg.train.max_steps; ++s) {
    zero_grads(lazy);
    set_table_grads(lazy, s);
    const StepStats st = optimizer_step(lazy, sl, cfg.train);
    // The eager pass with the same constants: optimizer_step's lr and clipping coefficient.
    set_table_grads(eager, s);
    const AdamWHyper h{static_cast<float>(lr_at(cfg.train, s)), 0.9f, 0.95f, 1e-8f, 0.1f, s + 1,
                       static_cast<float>(st.clip_coef)};
    ASSERT_EQ(static_cast<float>(st.lr), h.lr);
    ASSERT_LT(st.clip_coef, 1.0);
    for (size_t k = 0; k < eager.tables.size(); ++k)
      table_adamw_eager(eager.tables[k], se.tables.m[k].data(), se.tables.v[k].data(), eager.table_grads[k], h);
    // Rows with a gradient this step are current; a row without one lags (the update is deferred).
    for (size_t k = 0; k < lazy.tables.size(); ++k) {
      const int64_t d = lazy.tables[k].dim;
      EXPECT_EQ(0, std::memcmp(&lazy.tables[k].values()[0], &eager.tables[k].values()[0], sizeof(float) * d)) << "step " << s;
      if (std::memcmp(&lazy.tables[k].values()[20 * d], &eager.tables[k].values()[20 * d], sizeof(float) * d) != 0) deferred_seen = true;
    }
    if (s == 8) {  // bring rows 7 (last gradient at step 6), 31 and 45 (never) current mid-way
      const RowSync sync = table_row_sync(lazy, sl);
      for (size_t k = 0; k < lazy.tables.size(); ++k)
        for (int32_t r : {7, 45, 31, 7}) sync(static_cast<int64_t>(k), r);  // twice: a no-op the second time
      for (size_t k = 0; k < lazy.tables.size(); ++k) {
        const int64_t d = lazy.tables[k].dim;
        for (int32_t r : {7, 31, 45}) {
          EXPECT_EQ(0, std::memcmp(&lazy.tables[k].values()[r * d], &eager.tables[k].values()[r * d], sizeof(float) * d))
              << lazy.table_names[k] << " row " << r;
          EXPECT_EQ(0, std::memcmp(&sl.tables.m[k][r * d], &se.tables.m[k][r * d], sizeof(float) * d));
          EXPECT_EQ(0, std::memcmp(&sl.tables.v[k][r * d], &se.tables.v[k][r * d], sizeof(float) * d));
        }
      }
    }
  }
  EXPECT_TRUE(deferred_seen) << "no row was ever behind: the deferred path was not exercised";
  sync_tables(lazy, sl);
  EXPECT_TRUE(sl.tables.consts.empty());
  for (size_t k = 0; k < lazy.tables.size(); ++k) {
    EXPECT_TRUE(bits_equal(lazy.tables[k].to_vector(), eager.tables[k].to_vector())) << lazy.table_names[k];
    EXPECT_TRUE(bits_equal(sl.tables.m[k], se.tables.m[k])) << lazy.table_names[k];
    EXPECT_TRUE(bits_equal(sl.tables.v[k], se.tables.v[k])) << lazy.table_names[k];
  }
  // Syncing again changes nothing; the next step continues from there.
  auto before = lazy.tables[1].to_vector();
  sync_tables(lazy, sl);
  EXPECT_TRUE(bits_equal(lazy.tables[1].to_vector(), before));
}

TEST(DeferredTableAdamW, CheckpointNeedsCurrentRowsAndLoadsAsCurrent) {
  Config cfg = small_with_tables();
  Model m = make_model(cfg.model, 5);
  AdamWState s = make_adamw_state(m);
  for (int64_t step = 0; step < 3; ++step) {
    zero_grads(m);
    set_table_grads(m, step);
    optimizer_step(m, s, cfg.train);
  }
  const std::string run = ::testing::TempDir() + "/deferred_ckpt_" + std::to_string(::getpid());
  EXPECT_THROW(save_checkpoint(run, 3, cfg, m, s, {{"step", 3}, {"run_id", "r1"}}, 1), std::exception);
  sync_tables(m, s);
  const std::string dir = save_checkpoint(run, 3, cfg, m, s, {{"step", 3}, {"run_id", "r1"}}, 1);
  Model m2 = make_model(cfg.model, 9);
  AdamWState s2;
  load_checkpoint(dir, m2, &s2);
  EXPECT_EQ(s2.step, 3);
  EXPECT_TRUE(s2.tables.consts.empty());
  for (const auto& rows : s2.tables.row_step)
    for (int32_t r : rows) ASSERT_EQ(r, 3);
  // Both continue identically.
  for (auto* pair : {&m, &m2}) {
    AdamWState& st = pair == &m ? s : s2;
    zero_grads(*pair);
    set_table_grads(*pair, 3);
    optimizer_step(*pair, st, cfg.train);
    sync_tables(*pair, st);
  }
  for (size_t k = 0; k < m.tables.size(); ++k) EXPECT_TRUE(bits_equal(m.tables[k].to_vector(), m2.tables[k].to_vector()));
}

TEST(DeferredTableAdamW, SparseModeLeavesRowsWithoutGradientAlone) {
  Config cfg = small_with_tables();
  cfg.train.table_optimizer = "sparse";
  Model m = make_model(cfg.model, 5);
  const auto init = m.tables[0].to_vector();
  AdamWState s = make_adamw_state(m);
  for (int64_t step = 0; step < 4; ++step) {
    zero_grads(m);
    set_table_grads(m, step);
    optimizer_step(m, s, cfg.train);
  }
  EXPECT_TRUE(s.tables.consts.empty());
  sync_tables(m, s);  // nothing to replay
  const int64_t d = m.tables[0].dim;
  EXPECT_EQ(0, std::memcmp(&m.tables[0].values()[45 * d], &init[45 * d], sizeof(float) * d));
  EXPECT_NE(0, std::memcmp(&m.tables[0].values()[0], &init[0], sizeof(float) * d));
}

// A NaN or infinite gradient anywhere (a table row or a flat weight) is refused before anything
// moves: weights, tables, moments, the step count and the deferred-row bookkeeping stay as they were.
TEST(OptimizerStep, NonFiniteGradientChangesNothing) {
  const Config cfg = small_with_tables();
  for (int where = 0; where < 2; ++where) {
    Model m = make_model(cfg.model, 5);
    AdamWState s = make_adamw_state(m);
    for (int64_t step = 0; step < 3; ++step) {  // some deferred rows pending, as in training
      zero_grads(m);
      set_table_grads(m, step);
      m.grads[3] = 0.1f;
      optimizer_step(m, s, cfg.train);
    }
    const Model before = m;
    const AdamWState s_before = s;
    zero_grads(m);
    set_table_grads(m, 3);
    if (where == 0) m.table_grads[1].row(2)[0] = std::numeric_limits<float>::quiet_NaN();
    else m.grads[7] = std::numeric_limits<float>::infinity();
    EXPECT_THROW(optimizer_step(m, s, cfg.train), Error);
    EXPECT_TRUE(bits_equal(m.params, before.params));
    for (size_t k = 0; k < m.tables.size(); ++k) {
      EXPECT_TRUE(bits_equal(m.tables[k].to_vector(), before.tables[k].to_vector()));
      EXPECT_TRUE(bits_equal(s.tables.m[k], s_before.tables.m[k]));
      EXPECT_TRUE(bits_equal(s.tables.v[k], s_before.tables.v[k]));
      EXPECT_EQ(s.tables.row_step[k], s_before.tables.row_step[k]);
    }
    EXPECT_TRUE(bits_equal(s.m, s_before.m));
    EXPECT_TRUE(bits_equal(s.v, s_before.v));
    EXPECT_EQ(s.step, s_before.step);
    EXPECT_EQ(s.tables.consts.size(), s_before.tables.consts.size());
  }
}

// replay_row's invariant: a row may only be behind by steps whose constants are kept. A row marked
// older than the oldest kept step (a bookkeeping bug) must stop the process naming the numbers, not
// read outside the kept constants.
TEST(DeferredTableAdamWDeathTest, RowBehindTheKeptConstantsAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Config cfg = small_with_tables();
  Model m = make_model(cfg.model, 5);
  AdamWState s = make_adamw_state(m);
  for (int64_t step = 0; step < 3; ++step) {
    zero_grads(m);
    set_table_grads(m, step);
    optimizer_step(m, s, cfg.train);
  }
  sync_tables(m, s);  // all rows at step 3; no constants kept
  zero_grads(m);
  set_table_grads(m, 3);
  optimizer_step(m, s, cfg.train);  // step 4's constants kept; rows without a gradient at step 3
  s.tables.row_step[0][45] = 1;      // corrupt: behind the oldest kept step (base 3)
  EXPECT_DEATH(sync_tables(m, s), "table 0 row 45 is at step 1, asked for step 4, but the kept AdamW constants cover steps 4..4");
}

TEST(TableAdamW, EagerDenseSemanticsMatchDenseAdamWOverSteps) {
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
    table_adamw_eager(t, m.data(), v.data(), g, h);
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

TEST(TableAdamW, LazyTouchesOnlyRowsWithAGradientAndMatchesDenseOnThem) {
  const int64_t V = 30, d = 8;
  std::vector<TokenTable> tables = {random_table(V, d, 7)};
  TokenTable& t = tables[0];
  TokenTable td = t;
  std::vector<SparseRowGrad> grads(1);
  SparseRowGrad& g = grads[0];
  g.init(V, d);
  TableMoments st = make_table_moments(tables, true, 0);
  TableOptimizer lazy(tables, grads, st);
  std::vector<float>& m = st.m[0];
  std::vector<float>& v = st.v[0];
  std::vector<float> md(V * d, 0.f), vd = md;
  const std::vector<int32_t> rows = {2, 5, 29};  // the same rows every step
  for (int64_t step = 1; step <= 3; ++step) {
    g.clear();
    for (int32_t id : rows) {
      float* r = g.row(id);
      auto gr = randn(d, 200 + step * 31 + id);
      for (int64_t j = 0; j < d; ++j) r[j] += gr[j];
    }
    AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.7f};
    lazy.step(h, /*dense=*/false);
    table_adamw_eager(td, md.data(), vd.data(), g, h);
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
