// One optimizer step over a Model: global-norm clipping folded into AdamW, per docs/model.md.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/transformer.h"
#include "ops/adamw.h"

namespace jtok {

struct AdamWState {
  // The moments of the trainable flat parameters: parameter i of model.layout (model/trainable.h) has
  // its moments at m[moment_offset[i]] (its numel of them), or none (-1: frozen, --train-only tables).
  // With nothing frozen the layout of the parameters itself (moment_offset[i] = layout[i].offset).
  std::vector<float> m, v;
  std::vector<int64_t> moment_offset;
  std::vector<std::vector<float>> table_m, table_v;  // per table of model.tables, its AdamW moments
  int64_t step = 0;         // optimizer steps taken
  // table_optimizer "dense" defers the zero-gradient updates of table rows without a gradient (see
  // sync_tables): row r of table k has had the first table_row_step[k][r] steps applied; the
  // constants of the steps after table_consts_base (step s: table_consts[s - base - 1]) are kept
  // to replay the missing ones.
  std::vector<std::vector<int32_t>> table_row_step;
  std::vector<AdamWStepConsts> table_consts;
  int64_t table_consts_base = 0;
  // Counts of the catch-up work (statistics only, never saved): rows brought current by a replay,
  // those of them with non-zero moments (replayed as full AdamW updates, not the cold multiply),
  // and the steps those warm rows replayed. jtok bench-train reports them per step.
  int64_t replayed_rows = 0, replayed_warm_rows = 0, replayed_warm_steps = 0;
};

// tables = false: no table moments (left empty), for tables whose rows and moments live elsewhere
// (embedding parallelism: dist::ShardedTables allocates its shard's).
AdamWState make_adamw_state(const Model& model, bool tables = true);

// Token-indexed tables under table_optimizer "dense" (torch.optim.AdamW's semantics: every row
// moves every step, rows without a gradient by their decaying moments and the weight decay) are
// updated lazily but exactly: optimizer_step updates only the rows with a gradient, first replaying
// the zero-gradient steps the row missed, one by one with each step's constants, so every row ends
// bit for bit where the eager pass over the whole table would have put it. A row's value matters
// only when read, so readers bring rows current first:
// - a training forward sets Activations::row_sync = table_row_sync(model, state): each row is
//   brought current as a gather reads it (JTok-M: only the (id, table) pairs the router chose);
// - sync_tables before anything reads whole tables (evaluation, sampling, export; save_checkpoint
//   refuses a state with rows behind).
// Replaying k steps of a row costs k element-wise updates in cache (compute-bound) instead of k
// memory-bound passes over the table; rows never trained (zero moments) replay as k multiplies.
// The RowSync refers to model and state: it must not outlive them.
RowSync table_row_sync(Model& model, AdamWState& state);
void sync_tables(Model& model, AdamWState& state);
// After loading a checkpoint (whose tables are current): every row is current at state.step.
void mark_tables_current(const Model& model, AdamWState& state);

// sqrt(sum g^2) over every gradient (the tables' sparse rows included), accumulated in double.
// extra_sum_squares: gradients the model does not hold (table shards of other ranks and this one,
// already summed over the ranks: dist::ShardedTables::grad_sum_squares).
double grad_global_norm(const Model& model, double extra_sum_squares = 0);

struct StepStats {
  double grad_norm, lr, clip_coef;
  double table_lr = 0;  // the token-indexed modules' lr: lr * table_learning_rate / learning_rate
};

// Clips (if t.max_grad_norm > 0), updates the trainable parameters with AdamW at lr_at(t, state.step)
// (the token-indexed modules: tables, scalers, routers at that times table_learning_rate /
// learning_rate), increments state.step. Gradients are left as they were (caller zeroes them).
StepStats optimizer_step(Model& model, AdamWState& state, const TrainConfig& t, double extra_sum_squares = 0);
// The AdamW hyperparameters of the token-indexed tables at the step optimizer_step just took
// (state.step after it), for tables updated outside it (dist::ShardedTables).
AdamWHyper table_adamw_hyper(const TrainConfig& t, const StepStats& st, int64_t step);

}  // namespace jtok
