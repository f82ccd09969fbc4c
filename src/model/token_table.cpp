#include "model/token_table.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/lowp_linear.h"

namespace jtok {

const char* table_dtype_name(TableDtype dt) {
  switch (dt) {
    case TableDtype::F32: return "f32";
    case TableDtype::BF16: return "bf16";
    case TableDtype::I8: return "int8";
  }
  return "?";
}

TableDtype parse_table_dtype(const std::string& s, const std::string& what) {
  if (s == "f32") return TableDtype::F32;
  if (s == "bf16") return TableDtype::BF16;
  if (s == "int8") return TableDtype::I8;
  fail(what, ": table dtype '", s, "' is not one of f32, bf16, int8");
}

int64_t table_dtype_bytes(TableDtype dt) { return dt == TableDtype::F32 ? 4 : dt == TableDtype::BF16 ? 2 : 1; }

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

TokenTable TokenTable::quantized_in_ram(int64_t rows, int64_t dim, TableDtype dt, std::vector<uint8_t> bytes,
                                        std::vector<float> scales) {
  JTOK_CHECK(dt != TableDtype::F32, "quantized_in_ram: f32 tables use in_ram");
  JTOK_CHECK(rows >= 0 && dim >= 0 && static_cast<int64_t>(bytes.size()) == rows * dim * table_dtype_bytes(dt),
             table_dtype_name(dt), " token table of ", rows, " x ", dim, " given ", bytes.size(), " bytes");
  JTOK_CHECK(static_cast<int64_t>(scales.size()) == (dt == TableDtype::I8 ? rows : 0), table_dtype_name(dt),
             " token table of ", rows, " rows given ", scales.size(), " scales");
  TokenTable t;
  t.rows = rows;
  t.dim = dim;
  t.dtype_ = dt;
  t.qram_ = std::move(bytes);
  t.scale_ram_ = std::move(scales);
  return t;
}

TokenTable TokenTable::view(int64_t rows, int64_t dim, const float* data, std::shared_ptr<const void> owner) {
  return view(rows, dim, TableDtype::F32, data, nullptr, std::move(owner));
}

TokenTable TokenTable::view(int64_t rows, int64_t dim, TableDtype dt, const void* data, const float* scales,
                            std::shared_ptr<const void> owner) {
  JTOK_CHECK(owner != nullptr && (data != nullptr || rows * dim == 0), "token table view without storage");
  JTOK_CHECK((dt == TableDtype::I8) == (scales != nullptr) || rows == 0, "token table view: int8 tables (only) need scales");
  TokenTable t;
  t.rows = rows;
  t.dim = dim;
  t.dtype_ = dt;
  t.view_ = data;
  t.scale_view_ = scales;
  t.owner_ = std::move(owner);
  return t;
}

TokenTable TokenTable::unbound(int64_t rows, int64_t dim) {
  TokenTable t;
  t.rows = rows;
  t.dim = dim;
  return t;
}

void TokenTable::not_f32(const char* what) const {
  fail("token table (", rows, " x ", dim, ") is stored as ", table_dtype_name(dtype_), " (an inference export); ", what,
       " needs an f32 table: read it with read_row / the gather");
}

float* TokenTable::mutable_data() {
  if (dtype_ != TableDtype::F32)
    fail("token table (", rows, " x ", dim, ") is stored as ", table_dtype_name(dtype_),
         " (an inference export of jtok export --table-dtype); it cannot be trained or written: use the f32 checkpoint");
  if (!owner_ && static_cast<int64_t>(ram_.size()) != numel() && numel() > 0)
    fail("token table (", rows, " x ", dim, ") has no storage (unbound): load it first");
  if (owner_) fail("token table (", rows, " x ", dim, ") is a read-only view (e.g. a memory-mapped file); it cannot be written");
  return ram_.data();
}

float table_element_ref(const TokenTable& t, int64_t r, int64_t j) {
  switch (t.dtype()) {
    case TableDtype::F32: {
      float f;
      std::memcpy(&f, static_cast<const uint8_t*>(t.raw_row(r)) + j * 4, 4);
      return f;
    }
    case TableDtype::BF16: {
      uint16_t b;
      std::memcpy(&b, static_cast<const uint8_t*>(t.raw_row(r)) + j * 2, 2);
      return bf16_to_f32(b);
    }
    case TableDtype::I8:
      return static_cast<float>(static_cast<const int8_t*>(t.raw_row(r))[j]) * t.scales()[r];
  }
  return 0.0f;
}

void TokenTable::read_row_ref(int64_t r, float* out) const {
  for (int64_t j = 0; j < dim; ++j) out[j] = table_element_ref(*this, r, j);
}

void TokenTable::read_row(int64_t r, float* out) const {
  const int64_t d = dim;
  switch (dtype_) {
    case TableDtype::F32:
      std::memcpy(out, raw_row(r), sizeof(float) * d);
      return;
    case TableDtype::BF16: {
      const uint16_t* src = static_cast<const uint16_t*>(raw_row(r));
      uint32_t* o = reinterpret_cast<uint32_t*>(out);  // the float's bits: bf16 is its upper half
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) o[j] = static_cast<uint32_t>(src[j]) << 16;
      return;
    }
    case TableDtype::I8: {
      const int8_t* src = static_cast<const int8_t*>(raw_row(r));
      const float s = scales()[r];
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) out[j] = static_cast<float>(src[j]) * s;
      return;
    }
  }
}

std::vector<float> TokenTable::to_vector() const {
  std::vector<float> v(static_cast<size_t>(numel()));
  if (numel() == 0) return v;
  if (raw_data() == nullptr) fail("token table (", rows, " x ", dim, ") has no storage (unbound): load it first");
  for (int64_t r = 0; r < rows; ++r) read_row(r, v.data() + r * dim);
  return v;
}

TokenTable quantize_table(const TokenTable& t, TableDtype dt) {
  const int64_t R = t.rows, d = t.dim;
  if (t.dtype() != TableDtype::F32) fail("quantize_table: the table is already ", table_dtype_name(t.dtype()));
  if (dt == TableDtype::F32) return TokenTable::in_ram(R, d, t.to_vector());
  std::vector<uint8_t> bytes(static_cast<size_t>(R * d * table_dtype_bytes(dt)));
  std::vector<float> scales(dt == TableDtype::I8 ? static_cast<size_t>(R) : 0);
  if (t.numel() == 0) return TokenTable::quantized_in_ram(R, d, dt, std::move(bytes), std::move(scales));
  const float* x = t.row(0);  // f32 rows, contiguous
  if (dt == TableDtype::BF16)
    quantize_bf16(reinterpret_cast<uint16_t*>(bytes.data()), x, R * d);
  else
    quantize_int8_rows(reinterpret_cast<int8_t*>(bytes.data()), scales.data(), x, R, d);
  return TokenTable::quantized_in_ram(R, d, dt, std::move(bytes), std::move(scales));
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
  if (!t.is_view() || t.rows == 0 || t.raw_row(0) == nullptr) return 0;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t row_bytes = static_cast<uintptr_t>(t.row_stride_bytes());
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= t.rows) fail("token id ", ids[i], " outside the table's ", t.rows, " rows");
    const uintptr_t begin = reinterpret_cast<uintptr_t>(t.raw_row(ids[i]));
    const uintptr_t lo = begin & ~(page - 1), hi = (begin + row_bytes + page - 1) & ~(page - 1);
    madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_WILLNEED);  // a hint: its failure changes nothing
    if (t.dtype() == TableDtype::I8) {  // and the row's scale
      const uintptr_t s = reinterpret_cast<uintptr_t>(t.scales() + ids[i]) & ~(page - 1);
      madvise(reinterpret_cast<void*>(s), page, MADV_WILLNEED);
    }
  }
  return n;
}

void gather_unique_rows(float* out, const TokenTable& t, const RowBatch& rb, const RowSync& sync, int64_t table) {
  const int64_t U = static_cast<int64_t>(rb.unique.size()), d = t.dim;
#pragma omp parallel for schedule(static) if (U * d >= kParallelMin)  // a decoding step's few rows: serial
  for (int64_t u = 0; u < U; ++u) {
    if (sync) sync(table, rb.unique[u]);
    t.read_row(rb.unique[u], out + u * d);
  }
}

void gather_unique_rows_ref(float* out, const TokenTable& t, const RowBatch& rb) {
  const int64_t U = static_cast<int64_t>(rb.unique.size()), d = t.dim;
  for (int64_t u = 0; u < U; ++u)
    for (int64_t j = 0; j < d; ++j) out[u * d + j] = table_element_ref(t, rb.unique[u], j);
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
