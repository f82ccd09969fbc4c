#include "train/table_optimizer.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/profile.h"
#include "store/train_table_store.h"

namespace jtok {

TableMoments make_table_moments(const std::vector<TokenTable>& tables, bool moments, int64_t step) {
  TableMoments s;
  s.m.resize(tables.size());
  s.v.resize(tables.size());
  for (size_t k = 0; moments && k < tables.size(); ++k) {
    if (tables[k].trained_in_store()) continue;  // its moments are in the store
    s.m[k].assign(static_cast<size_t>(tables[k].numel()), 0.0f);
    s.v[k].assign(static_cast<size_t>(tables[k].numel()), 0.0f);
  }
  mark_rows_current(s, tables, step);
  return s;
}

void mark_rows_current(TableMoments& s, const std::vector<TokenTable>& tables, int64_t step) {
  s.row_step.resize(tables.size());
  for (size_t k = 0; k < tables.size(); ++k)
    s.row_step[k].assign(tables[k].trained_in_store() ? 0 : static_cast<size_t>(tables[k].rows), static_cast<int32_t>(step));
  s.consts.clear();
  s.consts_base = step;
}

namespace {

// Row r of table k for one update: its values, moments and step in place (tables in memory), or
// (a training store's table, store/train_table_store.h) copied into this thread's scratch and
// written back by commit().
struct RowAccess {
  float *p = nullptr, *m = nullptr, *v = nullptr;
  int32_t* step = nullptr;
  int64_t d = 0;
  bool ok = true;  // false: the store failed (its check() reports it); nothing to update
  RowAccess(std::vector<TokenTable>& tables, TableMoments& st, int64_t k, int64_t r) {
    TokenTable& t = tables[static_cast<size_t>(k)];
    d = t.dim;
    const TrainStoreTableRef ref = train_store_of(t.disk_rows());
    store_ = ref.store;
    if (!store_) {
      p = t.mutable_row(r);
      m = st.m[static_cast<size_t>(k)].data() + r * d;
      v = st.v[static_cast<size_t>(k)].data() + r * d;
      step = &st.row_step[static_cast<size_t>(k)][static_cast<size_t>(r)];
      return;
    }
    thread_local std::vector<float> scratch;  // one RowAccess at a time per thread
    scratch.resize(static_cast<size_t>(3 * d));
    p = scratch.data(), m = p + d, v = m + d, step = &disk_step_;
    table_ = ref.table, id_ = t.id_of(r);
    ok = store_->load_row(table_, id_, p, m, v, step);
  }
  void commit() {
    if (store_ && ok) store_->store_row(table_, id_, p, m, v, disk_step_);
  }

 private:
  TrainTableStore* store_ = nullptr;
  int64_t table_ = 0, id_ = 0;
  int32_t disk_step_ = 0;
};

}  // namespace

bool replay_steps(float* p, float* m, float* v, int64_t d, int64_t from, int64_t to, const TableMoments& st) {
  bool cold = true;
  for (int64_t i = 0; i < d; ++i) cold = cold && m[i] == 0.0f && v[i] == 0.0f;
  const AdamWStepConsts* c = st.consts.data() - st.consts_base - 1;  // c[s]: step s
  for (int64_t s = from + 1; s <= to; ++s) {
    if (cold) {
      const float decay = c[s].decay;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) p[i] *= decay;
    } else {
      adamw_elements(p, nullptr, m, v, d, c[s]);
    }
  }
  return !cold;
}

// Brings row r of table k from the steps it has to `to` (replay_steps). Returns whether the row
// changed.
static bool replay(RowAccess& a, TableMoments& st, int64_t k, int64_t r, int64_t to) {
  int32_t& have = *a.step;
  if (!a.ok || have >= to || st.consts.empty()) return false;  // current, or nothing deferred (sparse)
  // The constants of steps have+1 .. to must be kept: a row behind the oldest kept step, or a target
  // past the newest, would read outside consts. A bug, not bad input; called inside OpenMP loops,
  // where an exception cannot propagate, so it aborts with the values.
  if (have < st.consts_base || to > st.current_step()) {
    std::fprintf(stderr, "jtok: internal error: table %lld row %lld is at step %d, asked for step %lld, but the kept "
                 "AdamW constants cover steps %lld..%lld\n", static_cast<long long>(k), static_cast<long long>(r), have,
                 static_cast<long long>(to), static_cast<long long>(st.consts_base + 1),
                 static_cast<long long>(st.current_step()));
    std::abort();
  }
  const bool warm = replay_steps(a.p, a.m, a.v, a.d, have, to, st);
#pragma omp atomic
  st.replayed_rows += 1;
  if (warm) {
#pragma omp atomic
    st.replayed_warm_rows += 1;
#pragma omp atomic
    st.replayed_warm_steps += to - have;
  }
  have = static_cast<int32_t>(to);
  return true;
}

void TableOptimizer::replay_row(int64_t k, int64_t r, int64_t to) {
  if (st_.consts.empty()) return;  // nothing deferred
  const TokenTable& t = tables_[static_cast<size_t>(k)];
  if (!t.trained_in_store() && st_.row_step[static_cast<size_t>(k)][static_cast<size_t>(r)] >= to) return;  // current
  RowAccess a(tables_, st_, k, r);
  if (replay(a, st_, k, r, to)) a.commit();
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
    int64_t stepped = 0;
    // Rows with a gradient: (dense) catch up on the steps they missed, then this step's update.
#pragma omp parallel for schedule(static) reduction(+ : stepped)
    for (int64_t i = 0; i < R; ++i) {
      const int64_t r = g.ids[static_cast<size_t>(i)];
      RowAccess a(tables_, st_, static_cast<int64_t>(k), r);
      if (!a.ok) continue;
      if (dense) replay(a, st_, static_cast<int64_t>(k), r, h.step - 1);
      adamw_elements(a.p, g.rows.data() + i * d, a.m, a.v, d, c);
      *a.step = static_cast<int32_t>(h.step);
      a.commit();
      stepped += 1;
    }
    st_.stepped_rows += stepped;
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
