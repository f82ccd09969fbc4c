// The prefetch of token-table rows (src/infer/prefetch.h): the row list is exactly what a forward
// over the ids may read (every row JTok reads, all n_e candidates of JTok-M, of which the router
// reads some; nothing else), and the helper thread touches those rows of a mapped checkpoint
// without changing anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <set>

#include "infer/prefetch.h"
#include "train/checkpoint.h"

using namespace jtok;
namespace fs = std::filesystem;

static Config cfg() {
  Config c;
  auto& m = c.model;
  m.vocab_size = 97; m.hidden_size = 32; m.num_hidden_layers = 3; m.num_attention_heads = 4;
  m.num_key_value_heads = 2; m.intermediate_size = 48; m.max_position_embeddings = 32;
  m.initializer_range = 0.2;
  m.jtok = true; m.jtok_layers = "0,2";
  m.jtokm = true; m.jtokm_layers = "1-2"; m.jtokm_n_e = 3; m.jtokm_top_k = 2; m.jtokm_scale_init = 2.0;
  c.train.seq_len = 8;
  return c;
}

TEST(Prefetch, RowListIsExactlyWhatTheForwardMayRead) {
  const Config c = cfg();
  Model m = make_model(c.model, 3);
  ASSERT_EQ(m.tables.size(), 2u + 2u * 3u);
  const std::vector<int32_t> ids = {5, 3, 5, 96, 0, 3, 41, 5};
  const std::vector<TableRow> need = table_rows_needed(m, ids.data(), 8);
  const std::vector<int32_t> distinct = {0, 3, 5, 41, 96};
  // By table then id, each pair once: every table (2 JTok + 2 x 3 JTok-M) x every distinct id.
  ASSERT_EQ(need.size(), m.tables.size() * distinct.size());
  for (size_t i = 0; i < need.size(); ++i) {
    EXPECT_EQ(need[i].table, static_cast<int32_t>(i / distinct.size()));
    EXPECT_EQ(need[i].row, distinct[i % distinct.size()]);
  }
  // What the forward reads (RowSync is called before each row is gathered).
  std::mutex mu;
  std::set<std::pair<int64_t, int64_t>> read;
  Activations a;
  a.row_sync = [&](int64_t t, int64_t r) {
    std::lock_guard<std::mutex> lk(mu);
    read.insert({t, r});
  };
  forward(m, a, ids.data(), 2, 4);
  std::set<std::pair<int64_t, int64_t>> needed;
  for (const auto& r : need) needed.insert({r.table, r.row});
  for (const auto& r : read) EXPECT_TRUE(needed.count(r)) << "read table " << r.first << " row " << r.second << ", not prefetched";
  std::set<int64_t> jtok_tables = {m.jtok_table[0], m.jtok_table[2]};
  for (const auto& r : needed) {  // JTok: every row prefetched is read; JTok-M: the router reads a subset
    if (jtok_tables.count(r.first)) {
      EXPECT_TRUE(read.count(r)) << "table " << r.first << " row " << r.second;
    }
  }
  int64_t jtokm_read = 0;
  for (const auto& r : read) jtokm_read += !jtok_tables.count(r.first);
  EXPECT_GT(jtokm_read, 0);
  EXPECT_LT(jtokm_read, static_cast<int64_t>(6 * distinct.size()));  // top-2 of 3: not every candidate
  EXPECT_THROW(table_rows_needed(m, std::vector<int32_t>{97}.data(), 1), std::exception);
  // A model without tables needs nothing.
  Config plain = c;
  plain.model.jtok = plain.model.jtokm = false;
  EXPECT_TRUE(table_rows_needed(make_model(plain.model, 1), ids.data(), 8).empty());
}

TEST(Prefetch, HelperThreadTouchesTheRowsOfAMappedCheckpoint) {
  const Config c = cfg();
  Model m = make_model(c.model, 3);
  const fs::path run = fs::path(::testing::TempDir()) / "prefetch_run";
  fs::remove_all(run);
  const std::string dir = save_checkpoint(run.string(), 1, c, m, make_adamw_state(m), {{"step", 1}, {"run_id", "p"}}, 1);
  Model mapped = make_model(c.model, 9, {.init = false, .grads = false, .tables = false});
  load_checkpoint_mapped(dir, mapped);
  RowPrefetcher none(m);
  EXPECT_FALSE(none.useful());  // RAM tables: no thread, nothing to do
  none.submit(table_rows_needed(m, std::vector<int32_t>{1}.data(), 1));
  EXPECT_EQ(none.stats().rows, 0);
  const std::vector<int32_t> ids = {7, 8, 7, 60};
  Activations before;
  forward(mapped, before, ids.data(), 1, 4);
  RowPrefetcher p(mapped);
  ASSERT_TRUE(p.useful());
  const std::vector<TableRow> need = table_rows_needed(mapped, ids.data(), 4);
  p.submit(need);
  p.submit(table_rows_needed(mapped, std::vector<int32_t>{95}.data(), 1));
  p.drain();
  const PrefetchStats s = p.stats();
  EXPECT_EQ(s.jobs, 2);
  EXPECT_EQ(s.rows, static_cast<int64_t>(need.size() + mapped.tables.size()));
  EXPECT_GE(s.pages, s.rows);  // every row lies on at least one page
  for (int i = 0; i < 12; ++i) p.submit(need);  // faster than it can touch them: some are dropped, none lost
  p.drain();
  const PrefetchStats s2 = p.stats();
  EXPECT_EQ(s2.jobs + s2.dropped, 2 + 12);
  EXPECT_GE(s2.jobs, 3);  // the newest is never dropped
  const int64_t one = touch_rows(mapped, {{0, 7}});  // a 128-byte row: one page, or two if it straddles
  EXPECT_TRUE(one == 1 || one == 2) << one;
  EXPECT_EQ(touch_rows(m, {{0, 7}}), 0);  // RAM tables: nothing touched
  Activations after;
  forward(mapped, after, ids.data(), 1, 4);
  EXPECT_EQ(after.logits, before.logits);
}
