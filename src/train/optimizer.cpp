#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "core/parallel.h"

#include "core/profile.h"
#include "model/trainable.h"
#include "ops/adamw.h"
#include "train/schedule.h"

namespace jtok {

AdamWState make_adamw_state(const Model& model, bool tables) {
  AdamWState s;
  int64_t n = 0;
  for (const auto& p : model.layout) {
    s.moment_offset.push_back(param_trainable(model, p) ? n : -1);
    if (param_trainable(model, p)) n += p.numel;
  }
  s.m.assign(static_cast<size_t>(n), 0.0f);
  s.v.assign(static_cast<size_t>(n), 0.0f);
  s.tables = make_table_moments(model.tables, tables, 0);
  return s;
}

void mark_tables_current(const Model& model, AdamWState& state) { mark_rows_current(state.tables, model.tables, state.step); }

RowSync table_row_sync(Model& model, AdamWState& state) {
  return [&model, &state](int64_t table, int64_t row) {
    TableOptimizer(model.tables, model.table_grads, state.tables).sync_row(table, row);
  };
}

void sync_tables(Model& model, AdamWState& state) {
  if (model.tables.empty()) return;
  TableOptimizer(model.tables, model.table_grads, state.tables).sync_all();
}

double grad_global_norm(const Model& model, double extra_sum_squares) {
  const float* g = model.grads.data();
  const int64_t n = static_cast<int64_t>(model.grads.size());
  // Blocks of 4096 elements: a float partial per block (vectorizes), blocks summed in double.
  const int64_t blocks = (n + 4095) / 4096;
  double ss = parallel_sum(blocks, [&](int64_t b) {
    const int64_t lo = b * 4096, hi = std::min(n, lo + 4096);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = lo; i < hi; ++i) s += g[i] * g[i];
    return static_cast<double>(s);
  });
  for (const auto& tg : model.table_grads) ss += tg.sum_squares();
  ss += extra_sum_squares;
  return std::sqrt(ss);
}

// The first tensor (flat parameters in layout order, then tables) whose gradient holds a NaN or an
// infinity: only looked for once the norm has failed, so the normal path pays nothing.
static std::string first_nonfinite_grad(const Model& model) {
  for (const auto& p : model.layout)
    for (int64_t i = 0; i < p.numel; ++i)
      if (!std::isfinite(model.grads[static_cast<size_t>(p.offset + i)])) return p.name;
  for (size_t k = 0; k < model.table_grads.size(); ++k)
    for (float g : model.table_grads[k].rows)
      if (!std::isfinite(g)) return model.table_names[k];
  return "none found: the sum of squares overflowed";
}

AdamWHyper table_adamw_hyper(const TrainConfig& t, const StepStats& st, int64_t step) {
  return {static_cast<float>(st.table_lr), static_cast<float>(t.adam_beta1), static_cast<float>(t.adam_beta2),
          static_cast<float>(t.adam_epsilon), static_cast<float>(t.weight_decay), step, static_cast<float>(st.clip_coef)};
}

StepStats optimizer_step(Model& model, AdamWState& state, const TrainConfig& t, double extra_sum_squares) {
  JTOK_PROFILE("optimizer");
  StepStats st;
  st.grad_norm = grad_global_norm(model, extra_sum_squares);
  // Checked before anything moves: a NaN or infinite norm would turn into a NaN clipping coefficient
  // and reach every weight and moment.
  if (!std::isfinite(st.grad_norm))
    fail("the global gradient norm is ", st.grad_norm, " (first non-finite gradient: ", first_nonfinite_grad(model),
         "); the step was not applied (no weight or moment changed)");
  st.clip_coef = 1.0;
  if (t.max_grad_norm > 0) {
    // As torch.nn.utils.clip_grad_norm_: coef computed in fp32 from the norm.
    float coef = static_cast<float>(t.max_grad_norm) / (static_cast<float>(st.grad_norm) + 1e-6f);
    if (coef < 1.0f) st.clip_coef = coef;
  }
  st.lr = lr_at(t, state.step);
  st.table_lr = t.table_learning_rate < 0 ? st.lr : st.lr * (t.table_learning_rate / t.learning_rate);
  state.step += 1;
  JTOK_CHECK(state.moment_offset.size() == model.layout.size(), "optimizer state does not fit the model's layout");
  for (size_t i = 0; i < model.layout.size(); ++i) {
    const ParamInfo& p = model.layout[i];
    const int64_t mo = state.moment_offset[i];
    if (mo < 0) continue;  // frozen: no update, no moments
    const double lr = is_token_indexed_param(p.name) ? st.table_lr : st.lr;
    AdamWHyper h{static_cast<float>(lr), static_cast<float>(t.adam_beta1), static_cast<float>(t.adam_beta2),
                 static_cast<float>(t.adam_epsilon), p.decay ? static_cast<float>(t.weight_decay) : 0.0f, state.step,
                 static_cast<float>(st.clip_coef)};
    adamw_update(model.params.data() + p.offset, model.grads.data() + p.offset, state.m.data() + mo,
                 state.v.data() + mo, p.numel, h);
  }
  // Token-indexed tables: 2-D weights, so weight decay applies, as in the reference's decay group.
  if (model.tables.empty()) return st;
  TableOptimizer tables(model.tables, model.table_grads, state.tables);
  tables.step(table_adamw_hyper(t, st, state.step), t.table_optimizer != "sparse");
  if (t.table_optimizer == "dense-eager") tables.sync_all();  // every row now: dense's bits, the naive cost
  return st;
}

}  // namespace jtok
