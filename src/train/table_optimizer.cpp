#include "train/table_optimizer.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/profile.h"

namespace jtok {

TableMoments make_table_moments(const std::vector<TokenTable>& tables, bool moments, int64_t step) {
  TableMoments s;
  s.m.resize(tables.size());
  s.v.resize(tables.size());
  for (size_t k = 0; moments && k < tables.size(); ++k) {
    s.m[k].assign(static_cast<size_t>(tables[k].numel()), 0.0f);
    s.v[k].assign(static_cast<size_t>(tables[k].numel()), 0.0f);
  }
  mark_rows_current(s, tables, step);
  return s;
}

void mark_rows_current(TableMoments& s, const std::vector<TokenTable>& tables, int64_t step) {
  s.row_step.resize(tables.size());
  for (size_t k = 0; k < tables.size(); ++k)
    s.row_step[k].assign(static_cast<size_t>(tables[k].rows), static_cast<int32_t>(step));
  s.consts.clear();
  s.consts_base = step;
}

// Brings row r of table k from the steps it has to `to`, replaying the missed steps with a zero
// gradient: adamw_elements(nullptr) per step, exactly what the eager dense pass computes. A row
// whose moments are all zero (never had a gradient) stays at zero moments, and its update
// p * decay - step_size * 0 / (0 + eps) is p * decay: the same floats by a multiply per step.
void TableOptimizer::replay_row(int64_t k, int64_t r, int64_t to) {
  int32_t& have = st_.row_step[static_cast<size_t>(k)][static_cast<size_t>(r)];
  if (have >= to || st_.consts.empty()) return;  // current, or nothing deferred (sparse)
  // The constants of steps have+1 .. to must be kept: a row behind the oldest kept step, or a target
  // past the newest, would read outside consts. A bug, not bad input; called inside OpenMP loops,
  // where an exception cannot propagate, so it aborts with the values.
  if (have < st_.consts_base || to > st_.current_step()) {
    std::fprintf(stderr, "jtok: internal error: table %lld row %lld is at step %d, asked for step %lld, but the kept "
                 "AdamW constants cover steps %lld..%lld\n", static_cast<long long>(k), static_cast<long long>(r), have,
                 static_cast<long long>(to), static_cast<long long>(st_.consts_base + 1),
                 static_cast<long long>(st_.current_step()));
    std::abort();
  }
  const int64_t d = tables_[static_cast<size_t>(k)].dim;
  float* p = tables_[static_cast<size_t>(k)].mutable_row(r);
  float* m = st_.m[static_cast<size_t>(k)].data() + r * d;
  float* v = st_.v[static_cast<size_t>(k)].data() + r * d;
  bool cold = true;
  for (int64_t i = 0; i < d; ++i) cold = cold && m[i] == 0.0f && v[i] == 0.0f;
  const AdamWStepConsts* c = st_.consts.data() - st_.consts_base - 1;  // c[s]: step s
#pragma omp atomic
  st_.replayed_rows += 1;
  if (!cold) {
#pragma omp atomic
    st_.replayed_warm_rows += 1;
#pragma omp atomic
    st_.replayed_warm_steps += to - have;
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

void TableOptimizer::step(const AdamWHyper& h, bool dense) {
  JTOK_PROFILE("optimizer_tables");
  const AdamWStepConsts c = adamw_consts(h);
  if (dense) {
    JTOK_CHECK(st_.current_step() == h.step - 1, "table optimizer out of step: rows at ", st_.current_step(),
               ", step ", h.step, " asked");
    st_.consts.push_back(c);
  } else {
    JTOK_CHECK(st_.consts.empty(), "lazy table optimizer with deferred dense steps pending");
    st_.consts_base = h.step;
  }
  JTOK_CHECK(grads_.size() == tables_.size() && st_.m.size() == tables_.size(), "table optimizer: ", tables_.size(),
             " tables, ", grads_.size(), " gradients, ", st_.m.size(), " moments");
  for (size_t k = 0; k < tables_.size(); ++k) {
    const SparseRowGrad& g = grads_[k];
    const int64_t d = tables_[k].dim, R = static_cast<int64_t>(g.ids.size());
    // Rows with a gradient: (dense) catch up on the steps they missed, then this step's update.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < R; ++i) {
      const int64_t r = g.ids[static_cast<size_t>(i)];
      if (dense) replay_row(static_cast<int64_t>(k), r, h.step - 1);
      adamw_elements(tables_[k].mutable_row(r), g.rows.data() + i * d, st_.m[k].data() + r * d,
                     st_.v[k].data() + r * d, d, c);
      st_.row_step[k][static_cast<size_t>(r)] = static_cast<int32_t>(h.step);
    }
  }
}

void TableOptimizer::sync_all() {
  const int64_t to = st_.current_step();
  if (!st_.consts.empty()) {
    JTOK_PROFILE("table_sync");
    for (size_t k = 0; k < tables_.size(); ++k) {
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < tables_[k].rows; ++r) replay_row(static_cast<int64_t>(k), r, to);
    }
  }
  st_.consts.clear();  // every row is current: no step before `to` is needed again
  st_.consts_base = to;
}

void table_adamw_eager(TokenTable& t, float* tm, float* tv, const SparseRowGrad& g, const AdamWHyper& h) {
  const AdamWStepConsts c = adamw_consts(h);
  const int64_t d = t.dim;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < t.rows; ++r) {
    const int32_t s = g.slot[static_cast<size_t>(r)];
    // A row without gradient: (1 - b1) * 0 and (1 - b2) * 0 vanish, the moments only decay.
    const float* gr = s >= 0 ? g.rows.data() + static_cast<int64_t>(s) * d : nullptr;
    adamw_elements(t.mutable_row(r), gr, tm + r * d, tv + r * d, d, c);
  }
}

void table_adamw_lazy_ref(TokenTable& t, float* tm, float* tv, const SparseRowGrad& g, const AdamWHyper& h) {
  const AdamWStepConsts c = adamw_consts(h);
  const int64_t d = t.dim;
  for (size_t i = 0; i < g.ids.size(); ++i) {
    const int64_t r = g.ids[i];
    adamw_elements(t.mutable_row(r), g.rows.data() + static_cast<int64_t>(i) * d, tm + r * d, tv + r * d, d, c);
  }
}

void table_adamw_ref(TokenTable& t, float* m, float* v, const SparseRowGrad& g, const AdamWHyper& h) {
  std::vector<float> dense = densify(g, t.rows);
  adamw_update_ref(t.mutable_data(), dense.data(), m, v, t.numel(), h);
}

}  // namespace jtok
