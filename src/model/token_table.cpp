#include "model/token_table.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/int4_rows.h"
#include "ops/lowp_linear.h"

namespace jtok {

TokenTable TokenTable::in_ram(int64_t rows, int64_t dim) {
  return in_ram(rows, dim, std::vector<float>(static_cast<size_t>(rows * dim), 0.0f));
}

TokenTable TokenTable::in_ram(int64_t rows, int64_t dim, std::vector<float> values) {
  JTOK_CHECK(rows >= 0 && dim >= 0 && static_cast<int64_t>(values.size()) == rows * dim, "token table of ", rows,
             " x ", dim, " given ", values.size(), " values");
  TokenTable t;
  t.rows = t.id_count = rows;
  t.dim = dim;
  t.ram_ = std::move(values);
  return t;
}

TokenTable TokenTable::quantized_in_ram(int64_t rows, int64_t dim, Dtype dt, std::vector<uint8_t> bytes,
                                        std::vector<float> scales) {
  JTOK_CHECK(dt != Dtype::f32, "quantized_in_ram: f32 tables use in_ram");
  JTOK_CHECK(rows >= 0 && dim >= 0 && static_cast<int64_t>(bytes.size()) == rows * dtype_row_bytes(dt, dim),
             dtype_name(dt), " token table of ", rows, " x ", dim, " given ", bytes.size(), " bytes");
  JTOK_CHECK(static_cast<int64_t>(scales.size()) == (dtype_scaled(dt) ? rows : 0), dtype_name(dt),
             " token table of ", rows, " rows given ", scales.size(), " scales");
  TokenTable t;
  t.rows = t.id_count = rows;
  t.dim = dim;
  t.dtype_ = dt;
  t.qram_ = std::move(bytes);
  t.scale_ram_ = std::move(scales);
  return t;
}

TokenTable TokenTable::view(int64_t rows, int64_t dim, const float* data, std::shared_ptr<const void> owner) {
  return view(rows, dim, Dtype::f32, data, nullptr, std::move(owner));
}

TokenTable TokenTable::view(int64_t rows, int64_t dim, Dtype dt, const void* data, const float* scales,
                            std::shared_ptr<const void> owner) {
  JTOK_CHECK(owner != nullptr && (data != nullptr || rows * dim == 0), "token table view without storage");
  JTOK_CHECK(dtype_scaled(dt) == (scales != nullptr) || rows == 0, "token table view: int8 / int4 tables (only) need scales");
  TokenTable t;
  t.rows = t.id_count = rows;
  t.dim = dim;
  t.dtype_ = dt;
  t.view_ = data;
  t.scale_view_ = scales;
  t.owner_ = std::move(owner);
  return t;
}

TokenTable TokenTable::unbound(int64_t rows, int64_t dim) {
  TokenTable t;
  t.rows = t.id_count = rows;
  t.dim = dim;
  return t;
}

TokenTable TokenTable::shard_in_ram(int64_t id_count, int64_t id_first, int64_t id_stride, int64_t rows, int64_t dim) {
  JTOK_CHECK(id_stride >= 1 && id_first >= 0 && rows >= 0 && (rows == 0 || id_first + (rows - 1) * id_stride < id_count),
             "shard of ", rows, " rows from id ", id_first, " every ", id_stride, " in a table of ", id_count, " ids");
  TokenTable t = in_ram(rows, dim);
  t.id_count = id_count;
  t.id_first = id_first;
  t.id_stride = id_stride;
  return t;
}

TokenTable TokenTable::on_disk(std::shared_ptr<const DiskRows> rows) {
  JTOK_CHECK(rows, "on_disk: no rows");
  TokenTable t;
  t.rows = t.id_count = rows->ids();
  t.dim = rows->dim();
  t.dtype_ = rows->dtype();
  t.disk_ = std::move(rows);
  return t;
}

void TokenTable::not_in_memory(const char* what) const {
  fail("token table (", rows, " x ", dim, ") is in the disk store ", disk_->dir(), "; ", what,
       " needs a table in memory: read it with read_row / the gather");
}

void TokenTable::not_f32(const char* what) const {
  fail("token table (", rows, " x ", dim, ") is stored as ", dtype_name(dtype_), " (an inference export); ", what,
       " needs an f32 table: read it with read_row / the gather");
}

float* TokenTable::mutable_data() {
  if (dtype_ != Dtype::f32)
    fail("token table (", rows, " x ", dim, ") is stored as ", dtype_name(dtype_),
         " (an inference export of jtok export --table-dtype); it cannot be trained or written: use the f32 checkpoint");
  if (in_store()) not_in_memory("writing rows in place");
  if (!owner_ && static_cast<int64_t>(ram_.size()) != numel() && numel() > 0)
    fail("token table (", rows, " x ", dim, ") has no storage (unbound): load it first");
  if (owner_) fail("token table (", rows, " x ", dim, ") is a read-only view (e.g. a memory-mapped file); it cannot be written");
  return ram_.data();
}

float table_element_ref(const TokenTable& t, int64_t r, int64_t j) {
  std::vector<uint8_t> disk;  // a disk table: the row's raw elements read from the store
  float scale = 0.0f;
  const uint8_t* raw = nullptr;
  if (t.in_store()) {
    disk.resize(static_cast<size_t>(t.row_stride_bytes()));
    t.disk_rows()->read_row(t.id_of(r), disk.data(), &scale);
    raw = disk.data();
  } else {
    raw = static_cast<const uint8_t*>(t.raw_row(r));
    if (dtype_scaled(t.dtype())) scale = t.scales()[r];
  }
  switch (t.dtype()) {
    case Dtype::f32: {
      float f;
      std::memcpy(&f, raw + j * 4, 4);
      return f;
    }
    case Dtype::bf16: {
      uint16_t b;
      std::memcpy(&b, raw + j * 2, 2);
      return bf16_to_f32(b);
    }
    case Dtype::int8:
      return static_cast<float>(reinterpret_cast<const int8_t*>(raw)[j]) * scale;
    case Dtype::int4:
      return int4_element(raw, scale, j);
  }
  return 0.0f;
}

void TokenTable::read_row_ref(int64_t r, float* out) const {
  for (int64_t j = 0; j < dim; ++j) out[j] = table_element_ref(*this, r, j);
}

namespace {
// out (d) = one row's raw elements of dtype dt in f32 (int8 / int4: times the row's scale).
void dequantize_row(Dtype dt, const void* raw, float scale, int64_t d, float* out) {
  switch (dt) {
    case Dtype::f32:
      std::memcpy(out, raw, sizeof(float) * d);
      return;
    case Dtype::bf16: {
      const uint16_t* src = static_cast<const uint16_t*>(raw);
      uint32_t* o = reinterpret_cast<uint32_t*>(out);  // the float's bits: bf16 is its upper half
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) o[j] = static_cast<uint32_t>(src[j]) << 16;
      return;
    }
    case Dtype::int8: {
      const int8_t* src = static_cast<const int8_t*>(raw);
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) out[j] = static_cast<float>(src[j]) * scale;
      return;
    }
    case Dtype::int4:
      dequantize_int4_row(out, static_cast<const uint8_t*>(raw), scale, d);
      return;
  }
}
}  // namespace

void TokenTable::read_row(int64_t r, float* out) const {
  if (disk_) {  // the store's raw elements (f32: straight into out), then the same decoding
    float scale = 0.0f;
    if (dtype_ == Dtype::f32) {
      disk_->read_row(id_of(r), out, &scale);
      return;
    }
    thread_local std::vector<uint8_t> raw;
    raw.resize(static_cast<size_t>(row_stride_bytes()));
    disk_->read_row(id_of(r), raw.data(), &scale);
    dequantize_row(dtype_, raw.data(), scale, dim, out);
    return;
  }
  dequantize_row(dtype_, raw_row(r), dtype_scaled(dtype_) ? scales()[r] : 0.0f, dim, out);
}

std::vector<float> TokenTable::to_vector() const {
  std::vector<float> v(static_cast<size_t>(numel()));
  if (numel() == 0) return v;
  if (!in_store() && raw_data() == nullptr) fail("token table (", rows, " x ", dim, ") has no storage (unbound): load it first");
  for (int64_t r = 0; r < rows; ++r) read_row(r, v.data() + r * dim);
  return v;
}

TokenTable quantize_table(const TokenTable& t, Dtype dt) {
  const int64_t R = t.rows, d = t.dim;
  if (t.dtype() != Dtype::f32) fail("quantize_table: the table is already ", dtype_name(t.dtype()));
  if (dt == Dtype::f32) return TokenTable::in_ram(R, d, t.to_vector());
  std::vector<uint8_t> bytes(static_cast<size_t>(R * dtype_row_bytes(dt, d)));
  std::vector<float> scales(dtype_scaled(dt) ? static_cast<size_t>(R) : 0);
  if (t.numel() == 0) return TokenTable::quantized_in_ram(R, d, dt, std::move(bytes), std::move(scales));
  const float* x = t.row(0);  // f32 rows, contiguous
  if (dt == Dtype::bf16)
    quantize_bf16(reinterpret_cast<uint16_t*>(bytes.data()), x, R * d);
  else if (dt == Dtype::int8)
    quantize_int8_rows(reinterpret_cast<int8_t*>(bytes.data()), scales.data(), x, R, d);
  else
    quantize_int4_rows(bytes.data(), scales.data(), x, R, d);
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
  if (t.in_store()) return t.disk_rows()->prefetch(ids, n);
  if (!t.is_view() || t.rows == 0 || t.raw_row(0) == nullptr) return 0;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t row_bytes = static_cast<uintptr_t>(t.row_stride_bytes());
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= t.rows) fail("token id ", ids[i], " outside the table's ", t.rows, " rows");
    const uintptr_t begin = reinterpret_cast<uintptr_t>(t.raw_row(ids[i]));
    const uintptr_t lo = begin & ~(page - 1), hi = (begin + row_bytes + page - 1) & ~(page - 1);
    madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_WILLNEED);  // a hint: its failure changes nothing
    if (dtype_scaled(t.dtype())) {  // and the row's scale
      const uintptr_t s = reinterpret_cast<uintptr_t>(t.scales() + ids[i]) & ~(page - 1);
      madvise(reinterpret_cast<void*>(s), page, MADV_WILLNEED);
    }
  }
  return n;
}

void check_table_reads(const std::vector<TokenTable>& tables) {
  for (const TokenTable& t : tables)
    if (t.in_store())
      if (std::string e = t.disk_rows()->take_error(); !e.empty()) fail(e);
}

namespace {
// Every id held by t, checked before a parallel loop reads them (an exception cannot leave one).
void check_held(const TokenTable& t, const int32_t* ids, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    if (!t.holds(ids[i]))
      fail(what, ": id ", ids[i], " is not held by this table (", t.rows, " rows of ", t.id_count, " ids, from id ",
           t.id_first, " every ", t.id_stride, ")");
}
}  // namespace

namespace {
// The gathers' loop: one(i) for each of n rows of d values, on the calling thread below kParallelMin
// values (a decoding step's few rows, or one row of a caller's parallel loop), else in parallel.
template <typename F>
void each_row(int64_t n, int64_t d, const F& one) {
  if (n * d < kParallelMin) {
    for (int64_t i = 0; i < n; ++i) one(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) one(i);
}
}  // namespace

void gather_rows(float* out, const TokenTable& t, const int32_t* ids, int64_t n, const RowSync& sync, int64_t table) {
  check_held(t, ids, n, "token table gather");
  const int64_t d = t.dim;
  each_row(n, d, [&](int64_t i) {
    const int64_t r = t.row_of(ids[i]);
    if (sync) sync(table, r);
    t.read_row(r, out + i * d);
  });
}

void gather_rows_bf16(uint16_t* out, const TokenTable& t, const int32_t* ids, int64_t n) {
  check_held(t, ids, n, "token table gather");
  const int64_t d = t.dim;
  if (t.dtype() == Dtype::bf16) {  // the stored bits, in one pass
    each_row(n, d, [&](int64_t i) {
      const int64_t r = t.row_of(ids[i]);
      float scale = 0.0f;
      if (const DiskRows* disk = t.disk_rows())
        disk->read_row(t.id_of(r), out + i * d, &scale);
      else
        std::memcpy(out + i * d, t.raw_row(r), sizeof(uint16_t) * static_cast<size_t>(d));
    });
    return;
  }
  each_row(n, d, [&](int64_t i) {
    thread_local std::vector<float> row;
    row.resize(static_cast<size_t>(d));
    t.read_row(t.row_of(ids[i]), row.data());
    quantize_bf16_row(out + i * d, row.data(), d);
  });
}

void gather_rows_ref(float* out, const TokenTable& t, const int32_t* ids, int64_t n) {
  check_held(t, ids, n, "token table gather");
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < t.dim; ++j) out[i * t.dim + j] = table_element_ref(t, t.row_of(ids[i]), j);
}

void scatter_rows(TokenTable& t, const int32_t* ids, const float* rows, int64_t n) {
  check_held(t, ids, n, "token table scatter");
  float* w = t.mutable_data();
  const int64_t d = t.dim;
#pragma omp parallel for schedule(static) if (n * d >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) std::memcpy(w + t.row_of(ids[i]) * d, rows + i * d, sizeof(float) * d);
}

void scatter_rows_ref(TokenTable& t, const int32_t* ids, const float* rows, int64_t n) {
  check_held(t, ids, n, "token table scatter");
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < t.dim; ++j) t.mutable_row(t.row_of(ids[i]))[j] = rows[i * t.dim + j];
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

std::vector<float> densify(const SparseRowGrad& g, int64_t rows) {
  std::vector<float> dense(static_cast<size_t>(rows * g.dim), 0.0f);
  for (size_t i = 0; i < g.ids.size(); ++i)
    std::memcpy(dense.data() + static_cast<int64_t>(g.ids[i]) * g.dim, g.rows.data() + static_cast<int64_t>(i) * g.dim,
                sizeof(float) * g.dim);
  return dense;
}

}  // namespace jtok
