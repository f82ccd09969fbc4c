// One optimizer step over a Model: global-norm clipping folded into AdamW, per docs/model.md.
#pragma once
#include <cstdint>
#include <vector>

#include "model/transformer.h"
#include "ops/adamw.h"
#include "train/config.h"
#include "train/table_optimizer.h"

namespace jtok {

struct AdamWState {
  // The moments of the trainable flat parameters: parameter i of model.layout (model/trainable.h) has
  // its moments at m[moment_offset[i]] (its numel of them), or none (-1: frozen, --train-only tables).
  // With nothing frozen the layout of the parameters itself (moment_offset[i] = layout[i].offset).
  std::vector<float> m, v;
  std::vector<int64_t> moment_offset;
  // The tables' moments and deferred-step state (train/table_optimizer.h): per table of model.tables.
  TableMoments tables;
  int64_t step = 0;         // optimizer steps taken
};

// tables = false: no table moments (left empty), for tables whose rows and moments live elsewhere
// (embedding parallelism: dist::ShardedTables allocates its shard's).
AdamWState make_adamw_state(const Model& model, bool tables = true);

// The model's tables under the one table optimizer (train/table_optimizer.h), deferred and exact
// under "dense": a training forward sets Activations::row_sync = table_row_sync(model, state), so
// each row is brought current as a gather reads it (JTok-M: only the (id, table) pairs the router
// chose); sync_tables before anything reads whole tables (evaluation, sampling, export;
// save_checkpoint refuses a state with rows behind). The RowSync refers to model and state: it
// must not outlive them.
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
