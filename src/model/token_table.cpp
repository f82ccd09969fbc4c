#include "model/token_table.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"

namespace jtok {

TokenTable TokenTable::in_ram(int64_t rows, int64_t dim) {
  return in_ram(rows, dim, std::vector<float>(static_cast<size_t>(rows * dim), 0.0f));
}

TokenTable TokenTable::in_ram(int64_t rows, int64_t dim, std::vector<float> values) {
  JTOK_CHECK(rows >= 0 && dim >= 0 && static_cast<int64_t>(values.size()) == rows * dim, "token table of ", rows,
             " x ", dim, " given ", values.size(), " values");
  TokenTable t;
  t.rows = rows;
  t.dim = dim;
  t.ram_ = std::move(values);
  return t;
}

TokenTable TokenTable::view(int64_t rows, int64_t dim, const float* data, std::shared_ptr<const void> owner) {
  JTOK_CHECK(owner != nullptr && (data != nullptr || rows * dim == 0), "token table view without storage");
  TokenTable t;
  t.rows = rows;
  t.dim = dim;
  t.view_ = data;
  t.owner_ = std::move(owner);
  return t;
}

TokenTable TokenTable::unbound(int64_t rows, int64_t dim) {
  TokenTable t;
  t.rows = rows;
  t.dim = dim;
  return t;
}

float* TokenTable::mutable_data() {
  if (!owner_ && static_cast<int64_t>(ram_.size()) != numel() && numel() > 0)
    fail("token table (", rows, " x ", dim, ") has no storage (unbound): load it first");
  if (owner_) fail("token table (", rows, " x ", dim, ") is a read-only view (e.g. a memory-mapped file); it cannot be written");
  return ram_.data();
}

RowBatch dedup_ids(const int32_t* ids, int64_t N, int64_t V) {
  RowBatch rb;
  rb.inverse.resize(static_cast<size_t>(N));
  // Sort positions by id (stable), then walk runs: O(N log N) with N a few thousand.
  rb.order.resize(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    if (ids[n] < 0 || ids[n] >= V) fail("token id ", ids[n], " outside the table's ", V, " rows");
    rb.order[static_cast<size_t>(n)] = static_cast<int32_t>(n);
  }
  std::stable_sort(rb.order.begin(), rb.order.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  rb.offsets.push_back(0);
  for (int64_t i = 0; i < N; ++i) {
    const int32_t pos = rb.order[static_cast<size_t>(i)];
    if (i == 0 || ids[pos] != rb.unique.back()) {
      if (i > 0) rb.offsets.push_back(static_cast<int32_t>(i));
      rb.unique.push_back(ids[pos]);
    }
    rb.inverse[static_cast<size_t>(pos)] = static_cast<int32_t>(rb.unique.size() - 1);
  }
  rb.offsets.push_back(static_cast<int32_t>(N));
  return rb;
}

int64_t prefetch_rows(const TokenTable& t, const int32_t* ids, int64_t n) {
  if (!t.read_only() || t.data() == nullptr) return 0;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t row_bytes = static_cast<uintptr_t>(t.dim) * sizeof(float);
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= t.rows) fail("token id ", ids[i], " outside the table's ", t.rows, " rows");
    const uintptr_t begin = reinterpret_cast<uintptr_t>(t.row(ids[i]));
    const uintptr_t lo = begin & ~(page - 1), hi = (begin + row_bytes + page - 1) & ~(page - 1);
    madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_WILLNEED);  // a hint: its failure changes nothing
  }
  return n;
}

void gather_unique_rows(float* out, const TokenTable& t, const RowBatch& rb, const RowSync& sync, int64_t table) {
  const int64_t U = static_cast<int64_t>(rb.unique.size()), d = t.dim;
#pragma omp parallel for schedule(static)
  for (int64_t u = 0; u < U; ++u) {
    if (sync) sync(table, rb.unique[u]);
    std::memcpy(out + u * d, t.row(rb.unique[u]), sizeof(float) * d);
  }
}

void SparseRowGrad::init(int64_t vocab_rows, int64_t d) {
  dim = d;
  slot.assign(static_cast<size_t>(vocab_rows), -1);
  ids.clear();
  rows.clear();
}

void SparseRowGrad::clear() {
  for (int32_t id : ids) slot[static_cast<size_t>(id)] = -1;
  ids.clear();
  rows.clear();
}

float* SparseRowGrad::row(int32_t id) {
  int32_t& s = slot[static_cast<size_t>(id)];
  if (s < 0) {
    s = static_cast<int32_t>(ids.size());
    ids.push_back(id);
    rows.resize(rows.size() + static_cast<size_t>(dim), 0.0f);
  }
  return rows.data() + static_cast<int64_t>(s) * dim;
}

double SparseRowGrad::sum_squares() const {
  const int64_t n = static_cast<int64_t>(rows.size());
  return parallel_sum((n + 4095) / 4096, [&](int64_t b) {
    const int64_t lo = b * 4096, hi = std::min(n, lo + 4096);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = lo; i < hi; ++i) s += rows[i] * rows[i];
    return static_cast<double>(s);
  });
}

void table_adamw_dense_semantics(TokenTable& t, float* tm, float* tv, const SparseRowGrad& g, const AdamWHyper& h) {
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

void table_adamw_sparse_rows(TokenTable& t, float* tm, float* tv, const SparseRowGrad& g, const AdamWHyper& h) {
  const AdamWStepConsts c = adamw_consts(h);
  const int64_t d = t.dim, R = static_cast<int64_t>(g.ids.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < R; ++i) {
    const int64_t r = g.ids[i];
    adamw_elements(t.mutable_row(r), g.rows.data() + i * d, tm + r * d, tv + r * d, d, c);
  }
}

std::vector<float> densify(const SparseRowGrad& g, int64_t rows) {
  std::vector<float> dense(static_cast<size_t>(rows * g.dim), 0.0f);
  for (size_t i = 0; i < g.ids.size(); ++i)
    std::memcpy(dense.data() + static_cast<int64_t>(g.ids[i]) * g.dim, g.rows.data() + static_cast<int64_t>(i) * g.dim,
                sizeof(float) * g.dim);
  return dense;
}

void table_adamw_ref(TokenTable& t, float* m, float* v, const SparseRowGrad& g, const AdamWHyper& h) {
  std::vector<float> dense = densify(g, t.rows);
  adamw_update_ref(t.mutable_data(), dense.data(), m, v, t.numel(), h);
}

}  // namespace jtok
