// One optimizer step over a Model: global-norm clipping folded into AdamW, per docs/model.md.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/transformer.h"

namespace jtok {

struct AdamWState {
  std::vector<float> m, v;  // same layout as the parameters
  std::vector<std::vector<float>> table_m, table_v;  // per table of model.tables, its AdamW moments
  int64_t step = 0;         // optimizer steps taken
};

AdamWState make_adamw_state(const Model& model);

// sqrt(sum g^2) over every gradient (the tables' sparse rows included), accumulated in double.
double grad_global_norm(const Model& model);

struct StepStats {
  double grad_norm, lr, clip_coef;
};

// Clips (if t.max_grad_norm > 0), updates parameters with AdamW at lr_at(t, state.step),
// increments state.step. Gradients are left as they were (caller zeroes them).
StepStats optimizer_step(Model& model, AdamWState& state, const TrainConfig& t);

}  // namespace jtok
