// The one AdamW of token-indexed tables, for every storage the trainer updates: a process's whole
// tables (Model::tables) and a rank's shard of owned rows (dist::ShardedTables::tables()) alike.
//
// Two semantics (TrainConfig::table_optimizer):
// - "dense": torch.optim.AdamW over a dense table whose rows without a gradient have a zero one:
//   every row moves every step (its moments decay, the update from them and the weight decay apply).
//   Run deferred and exact: a step updates only the rows with a gradient, after replaying, one by
//   one with each step's kept constants, the zero-gradient steps the row missed; every other row is
//   brought current when something reads it (row_sync, the gathers' hook) or all at once
//   (sync_all, before whole tables are read or written). A row ends bit for bit where the eager
//   pass over the whole table (table_adamw_eager) would have put it. Replaying k steps costs k
//   element-wise updates in cache instead of k memory-bound passes over the table; a row never
//   trained (zero moments) replays as k multiplies.
// - "sparse" (lazy): only the rows with a gradient move; the others keep values and moments.
#pragma once
#include <cstdint>
#include <vector>

#include "model/token_table.h"
#include "ops/adamw.h"

namespace jtok {

// The AdamW state of a set of tables: per table, its rows' moments and the step each row has had.
struct TableMoments {
  // Per table: (rows, dim), or empty (moments elsewhere: a shard's, or a training store's table,
  // whose rows' moments and steps are in its blocks: store/train_table_store.h).
  std::vector<std::vector<float>> m, v;
  std::vector<std::vector<int32_t>> row_step;  // per table: (rows) optimizer steps applied to the row, or empty
  // The constants of the steps after consts_base (step s: consts[s - consts_base - 1]), kept to
  // replay the steps rows missed; empty when every row is current (and always under "sparse").
  std::vector<AdamWStepConsts> consts;
  int64_t consts_base = 0;
  // Catch-up work (statistics only, never saved): rows brought current by a replay, those of them
  // with non-zero moments (replayed as full AdamW updates), and the steps those warm rows replayed;
  // and the rows the steps updated with a gradient (every table's, summed over steps).
  int64_t replayed_rows = 0, replayed_warm_rows = 0, replayed_warm_steps = 0;
  int64_t stepped_rows = 0;
  // The step every row is brought to: the last one whose constants are kept.
  int64_t current_step() const { return consts_base + static_cast<int64_t>(consts.size()); }
};

// Zero moments for each table (moments = false: left empty, for tables whose moments live
// elsewhere), every row current at `step`.
TableMoments make_table_moments(const std::vector<TokenTable>& tables, bool moments, int64_t step);
// Every row current at `step` (after loading tables that are): no step kept.
void mark_rows_current(TableMoments& s, const std::vector<TokenTable>& tables, int64_t step);

// One row's replay, the deferred optimizer's own arithmetic: p, m, v (d) of a row at step `from`
// brought to step `to` (from < to; st keeps the constants of steps from+1..to, checked by the
// caller) by the zero-gradient steps in between: adamw_elements(nullptr) per step, exactly what the
// eager dense pass computes; a row whose moments are all zero (never had a gradient) stays at zero
// moments, and its update p * decay - step_size * 0 / (0 + eps) is p * decay: the same floats by a
// multiply per step. Returns whether the row was warm (non-zero moments).
bool replay_steps(float* p, float* m, float* v, int64_t d, int64_t from, int64_t to, const TableMoments& st);

// A view over writable f32 tables, their row-sparse gradients (keyed by row of the storage) and
// their moments; holds nothing itself. A table in a training store on disk (TokenTable::on_disk)
// is updated row by row through the store: each row, its moments and step read into scratch,
// updated by the same code, written back.
class TableOptimizer {
 public:
  TableOptimizer(std::vector<TokenTable>& tables, const std::vector<SparseRowGrad>& grads, TableMoments& st)
      : tables_(tables), grads_(grads), st_(st) {}
  // The step h.step (1-based; the last one taken was h.step - 1) with the gradients.
  void step(const AdamWHyper& h, bool dense);
  // Row r of table k brought current (a reader's hook: RowSync, possibly from several threads for
  // different rows). Nothing deferred (sparse): nothing to do.
  void sync_row(int64_t k, int64_t r) { replay_row(k, r, st_.current_step()); }
  RowSync row_sync() {
    return [this](int64_t k, int64_t r) { sync_row(k, r); };
  }
  void sync_all();  // every row current; the kept constants dropped

 private:
  void replay_row(int64_t k, int64_t r, int64_t to);
  std::vector<TokenTable>& tables_;
  const std::vector<SparseRowGrad>& grads_;
  TableMoments& st_;
};

// The plain references the tests hold the optimizer to. Eager dense semantics: one pass over the
// whole table, rows without a gradient with a zero one. Lazy: the rows with a gradient only. m, v:
// the table's moments (rows, dim).
void table_adamw_eager(TokenTable& t, float* m, float* v, const SparseRowGrad& g, const AdamWHyper& h);
void table_adamw_lazy_ref(TokenTable& t, float* m, float* v, const SparseRowGrad& g, const AdamWHyper& h);
// The textbook form: the dense gradient materialised, the dense AdamW reference over the table.
void table_adamw_ref(TokenTable& t, float* m, float* v, const SparseRowGrad& g, const AdamWHyper& h);

}  // namespace jtok
