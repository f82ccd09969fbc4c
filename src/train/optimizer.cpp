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
  s.table_m.resize(model.tables.size());
  s.table_v.resize(model.tables.size());
  for (size_t k = 0; tables && k < model.tables.size(); ++k) {
    s.table_m[k].assign(static_cast<size_t>(model.tables[k].numel()), 0.0f);
    s.table_v[k].assign(static_cast<size_t>(model.tables[k].numel()), 0.0f);
  }
  mark_tables_current(model, s);
  return s;
}

void mark_tables_current(const Model& model, AdamWState& state) {
  state.table_row_step.resize(model.tables.size());
  for (size_t k = 0; k < model.tables.size(); ++k)
    state.table_row_step[k].assign(static_cast<size_t>(model.tables[k].rows), static_cast<int32_t>(state.step));
  state.table_consts.clear();
  state.table_consts_base = state.step;
}

namespace {

// The step every table row is brought to: the last one whose constants are kept.
int64_t tables_step(const AdamWState& state) {
  return state.table_consts_base + static_cast<int64_t>(state.table_consts.size());
}

// Brings row r of table k from the steps it has to `to`, replaying the missed steps with a zero
// gradient: adamw_elements(nullptr) per step, exactly what the eager dense pass computes. A row
// whose moments are all zero (never had a gradient) stays at zero moments, and its update
// p * decay - step_size * 0 / (0 + eps) is p * decay: the same floats by a multiply per step.
void replay_row(Model& model, AdamWState& state, size_t k, int64_t r, int64_t to) {
  int32_t& have = state.table_row_step[k][static_cast<size_t>(r)];
  if (have >= to || state.table_consts.empty()) return;  // current, or nothing deferred (sparse mode)
  // The constants of steps have+1 .. to must be kept: a row behind the oldest kept step, or a target
  // past the newest, would read outside table_consts. A bug, not bad input; called inside OpenMP
  // loops, where an exception cannot propagate, so it aborts with the values.
  if (have < state.table_consts_base || to > tables_step(state)) {
    std::fprintf(stderr, "jtok: internal error: table %zu row %lld is at step %d, asked for step %lld, but the kept "
                 "AdamW constants cover steps %lld..%lld\n", k, static_cast<long long>(r), have, static_cast<long long>(to),
                 static_cast<long long>(state.table_consts_base + 1), static_cast<long long>(tables_step(state)));
    std::abort();
  }
  const int64_t d = model.tables[k].dim;
  float* p = model.tables[k].mutable_row(r);
  float* m = state.table_m[k].data() + r * d;
  float* v = state.table_v[k].data() + r * d;
  bool cold = true;
  for (int64_t i = 0; i < d; ++i) cold = cold && m[i] == 0.0f && v[i] == 0.0f;
  const AdamWStepConsts* c = state.table_consts.data() - state.table_consts_base - 1;  // c[s]: step s
#pragma omp atomic
  state.replayed_rows += 1;
  if (!cold) {
#pragma omp atomic
    state.replayed_warm_rows += 1;
#pragma omp atomic
    state.replayed_warm_steps += to - have;
  }
  for (int64_t s = have + 1; s <= to; ++s) {
    if (cold) {
      const float decay = c[s].decay;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) p[i] *= decay;
    } else {
      adamw_elements(p, nullptr, m, v, d, c[s]);
    }
  }
  have = static_cast<int32_t>(to);
}

// Deferred dense-semantics AdamW of step state.step (its constants already in table_consts): the
// rows with a gradient catch up on the steps they missed, then take this step with their gradient.
void table_adamw_deferred(Model& model, AdamWState& state, size_t k) {
  const SparseRowGrad& g = model.table_grads[k];
  const int64_t d = model.tables[k].dim, R = static_cast<int64_t>(g.ids.size()), step = state.step;
  const AdamWStepConsts& c = state.table_consts.back();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < R; ++i) {
    const int64_t r = g.ids[static_cast<size_t>(i)];
    replay_row(model, state, k, r, step - 1);
    adamw_elements(model.tables[k].mutable_row(r), g.rows.data() + i * d, state.table_m[k].data() + r * d,
                   state.table_v[k].data() + r * d, d, c);
    state.table_row_step[k][static_cast<size_t>(r)] = static_cast<int32_t>(step);
  }
}

}  // namespace

RowSync table_row_sync(Model& model, AdamWState& state) {
  return [&model, &state](int64_t table, int64_t row) {
    replay_row(model, state, static_cast<size_t>(table), row, tables_step(state));
  };
}

void sync_tables(Model& model, AdamWState& state) {
  const int64_t to = tables_step(state);
  if (model.tables.empty() || state.table_consts.empty()) return;
  JTOK_PROFILE("table_sync");
  for (size_t k = 0; k < model.tables.size(); ++k) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < model.tables[k].rows; ++r) replay_row(model, state, k, r, to);
  }
  state.table_consts.clear();  // every row is current: no step before `to` is needed again
  state.table_consts_base = to;
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
  JTOK_PROFILE("optimizer_tables");
  const AdamWHyper h = table_adamw_hyper(t, st, state.step);
  if (t.table_optimizer == "sparse") {
    JTOK_CHECK(state.table_consts.empty(), "sparse table optimizer with deferred dense steps pending");
    for (size_t l = 0; l < model.tables.size(); ++l)
      table_adamw_sparse_rows(model.tables[l], state.table_m[l].data(), state.table_v[l].data(), model.table_grads[l], h);
    state.table_consts_base = state.step;
    return st;
  }
  JTOK_CHECK(tables_step(state) == state.step - 1, "table optimizer state out of step");
  state.table_consts.push_back(adamw_consts(h));
  for (size_t l = 0; l < model.tables.size(); ++l) table_adamw_deferred(model, state, l);
  return st;
}

}  // namespace jtok
