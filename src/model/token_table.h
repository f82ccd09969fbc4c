// Token-indexed tables (engineering.md section 2): V rows of d values, their own kind of storage,
// reached only through one deduplicating gather path, with row-sparse gradients.
//
// A micro-batch's ids are deduplicated once (RowBatch); each unique row is gathered once and
// scattered to its positions; the backward produces (unique ids, rows), never a dense V x d grad.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "store/disk_rows.h"

namespace jtok {

// How a table's rows are stored. f32 is the training format (and the default); bf16 (the upper 16
// bits of the float, rounded to nearest even), int8 (symmetric, one float scale per row:
// x ~ scale[r] * q, q in [-127, 127], scale[r] = max_j |x[r][j]| / 127) and int4 (the same with
// q in [-7, 7], scale[r] = max_j |x[r][j]| / 7, two values a byte: ops/int4_rows.h) are inference
// exports (jtok export --table-dtype): read-only, dequantized to f32 row by row by the gather
// (Dtype, core/dtype.h).

// A table is a view of rows x dim values over its storage: its own RAM (a std::vector, writable if
// f32: the trainer updates it), or a read-only region owned by something else (a memory-mapped
// checkpoint file: the rows are read in place, only touched pages become resident). Its elements
// are f32, bf16, or int8 / int4 with a per-row scale (Dtype). Readers of any dtype use read_row() (or
// the gathers below, which dequantize); data() / row() / values() are the f32 tables' direct view
// and fail on another dtype. Writers use mutable_*(), which fail on a read-only view and on a
// quantized table. Copying a RAM table copies its rows; copying a view shares the owner.
// A rank's shard (embedding parallelism) is a RAM table of the rows that rank holds, with its
// id-to-row map: row r holds id id_first + r * id_stride of a table of id_count ids (every P-th id
// from the rank's, or a contiguous range); a whole table holds ids 0..rows-1 (0, 1, rows). Readers
// and writers name ids, never rows: gather_rows and scatter_rows below are the one way in and out.
class TokenTable {
 public:
  int64_t rows = 0, dim = 0;  // set by the factories; read freely, never reassign
  int64_t id_count = 0, id_first = 0, id_stride = 1;  // the id-to-row map (whole table: rows, 0, 1)

  TokenTable() = default;
  // Writable RAM storage of rows x dim zeros, or of `values` (size rows * dim, checked).
  static TokenTable in_ram(int64_t rows, int64_t dim);
  static TokenTable in_ram(int64_t rows, int64_t dim, std::vector<float> values);
  // RAM storage of a bf16 / int8 / int4 table: `bytes` (rows rows of dtype_row_bytes(dt, dim),
  // little-endian) and, for int8 / int4, `scales` (rows floats; empty for bf16). Checked sizes.
  // Read-only.
  static TokenTable quantized_in_ram(int64_t rows, int64_t dim, Dtype dt, std::vector<uint8_t> bytes,
                                     std::vector<float> scales);
  // Read-only view of rows x dim floats at `data`, kept alive by `owner` (e.g. a MappedFile).
  static TokenTable view(int64_t rows, int64_t dim, const float* data, std::shared_ptr<const void> owner);
  // The same for any dtype: `data` rows rows of dt, `scales` rows floats (int8 / int4 only).
  static TokenTable view(int64_t rows, int64_t dim, Dtype dt, const void* data, const float* scales,
                         std::shared_ptr<const void> owner);
  // A shape without storage, for a loader to replace with a view (data() is null; writes fail).
  static TokenTable unbound(int64_t rows, int64_t dim);
  // A table whose rows a disk store keeps (store/disk_rows.h: a token-major store's table, read-only,
  // or a training store's, whose rows the table optimizer writes through the store), read through
  // the one gather.
  static TokenTable on_disk(std::shared_ptr<const DiskRows> rows);
  // Writable RAM zeros for `rows` ids of a table of id_count: id_first, id_first + id_stride, ...
  static TokenTable shard_in_ram(int64_t id_count, int64_t id_first, int64_t id_stride, int64_t rows, int64_t dim);

  bool holds(int64_t id) const {
    return id >= id_first && id < id_count && (id - id_first) % id_stride == 0 && (id - id_first) / id_stride < rows;
  }
  int64_t row_of(int64_t id) const { return (id - id_first) / id_stride; }  // id must be held
  int64_t id_of(int64_t row) const { return id_first + row * id_stride; }

  Dtype dtype() const { return dtype_; }
  bool read_only() const { return owner_ != nullptr || disk_ != nullptr || dtype_ != Dtype::f32; }
  const DiskRows* disk_rows() const { return disk_.get(); }  // a disk table's rows, else null
  bool in_store() const { return disk_ != nullptr; }
  // Rows a trainer updates in a training store: a checkpoint neither copies nor scans them.
  bool trained_in_store() const { return disk_ && disk_->trained_in_store(); }
  bool is_view() const { return owner_ != nullptr; }  // storage owned elsewhere (a mapped file)
  // f32 rows this process holds in memory (not a disk table's, not rows sharded to other ranks).
  bool f32_rows_in_memory() const { return dtype_ == Dtype::f32 && !in_store() && (owner_ ? view_ != nullptr : !ram_.empty()); }
  int64_t numel() const { return rows * dim; }
  // Storage bytes: the rows plus the int8 / int4 scales.
  int64_t storage_bytes() const { return rows * row_stride_bytes() + (dtype_scaled(dtype_) ? rows * 4 : 0); }
  // f32 tables only (fail otherwise, naming the dtype).
  const float* data() const {
    if (dtype_ != Dtype::f32) not_f32("data()");
    if (in_store()) not_in_memory("data()");
    return owner_ ? static_cast<const float*>(view_) : ram_.data();
  }
  const float* row(int64_t r) const { return data() + r * dim; }
  std::span<const float> values() const { return {data(), static_cast<size_t>(numel())}; }
  // Any dtype: the raw elements of row r (row_stride_bytes() each), and an int8 / int4 table's scales.
  const void* raw_row(int64_t r) const { return raw_data() + r * row_stride_bytes(); }
  int64_t row_stride_bytes() const { return dtype_row_bytes(dtype_, dim); }
  const float* scales() const { return owner_ ? scale_view_ : scale_ram_.data(); }
  // out (dim) = row r in f32 (dequantized): the fast path (vectorized), and the plain reference
  // (one element at a time through table_element_ref). Equal bit for bit (tests/test_jtok.cpp).
  void read_row(int64_t r, float* out) const;
  void read_row_ref(int64_t r, float* out) const;
  float* mutable_data();  // fails (naming the table's shape) on a read-only view, an unbound or a quantized table
  float* mutable_row(int64_t r) { return mutable_data() + r * dim; }
  std::span<float> mutable_values() { return {mutable_data(), static_cast<size_t>(numel())}; }
  std::vector<float> to_vector() const;  // every row in f32 (dequantized); tests and exports

 private:
  [[noreturn]] void not_f32(const char* what) const;
  [[noreturn]] void not_in_memory(const char* what) const;
  const uint8_t* raw_data() const {
    if (in_store()) not_in_memory("raw rows");
    if (owner_) return static_cast<const uint8_t*>(view_);
    return dtype_ == Dtype::f32 ? reinterpret_cast<const uint8_t*>(ram_.data()) : qram_.data();
  }
  Dtype dtype_ = Dtype::f32;
  std::vector<float> ram_;               // f32 RAM storage (empty for a view)
  std::vector<uint8_t> qram_;            // bf16 / int8 / int4 RAM storage
  std::vector<float> scale_ram_;         // int8 / int4 RAM scales
  const void* view_ = nullptr;           // a view's rows
  const float* scale_view_ = nullptr;    // a view's int8 / int4 scales
  std::shared_ptr<const void> owner_;    // keeps a view's storage alive; null for RAM
  std::shared_ptr<const DiskRows> disk_;  // a disk table's rows (its store's)
};

// The reference decoding of one element: bf16 bits << 16, or float(q) * scale (int4: its nibble).
float table_element_ref(const TokenTable& t, int64_t r, int64_t j);
// A RAM copy of the f32 table t stored as dt (bf16: round to nearest even; int8 / int4: symmetric
// per-row scale max|x| / 127 (/ 7), q = round(x / scale)). f32 gives a plain copy. t must be f32.
TokenTable quantize_table(const TokenTable& t, Dtype dt);

// Brings row `row` of table `table` (an index into Model::tables) up to date before a gather reads
// it. Set (Activations::row_sync) by a trainer whose optimizer defers the updates of rows without a
// gradient (train/optimizer.h); empty otherwise. Called at most once per (table, row) per gather,
// possibly from several threads for different rows.
using RowSync = std::function<void(int64_t table, int64_t row)>;

struct RowBatch;
struct SparseRowGrad;
// Token-indexed tables whose rows this process does not hold (embedding parallelism, src/dist):
// when set (Activations::tables), the forward and backward reach the tables only through it, and
// Model::tables keep their shapes but no rows. The model never knows where the rows live.
struct TableProvider {
  virtual ~TableProvider() = default;
  // JTok: out (U, d) = rows of table `table` (an index into Model::tables) for rb.unique.
  virtual void rows(float* out, int64_t table, const RowBatch& rb) = 0;
  // JTok backward: this micro-batch's row-sparse gradient of `table` (keyed by id); the provider
  // takes it (to the rows' owners) and clears g.
  virtual void row_grads(int64_t table, SparseRowGrad& g) = 0;
  // JTok-M, the layer whose n_e tables start at table_base: e (N, d) = sum_k w[n,k] E_{sel[n,k]}[ids[n]].
  virtual void mix(float* e, int64_t table_base, const int32_t* ids, const int32_t* sel, const float* w, int64_t N,
                   int64_t K) = 0;
  // Its backward (layers in reverse order of their forwards): de (N, d) = dL/de in, dw (N, K) =
  // dL/dw out; the tables' gradients stay with the provider.
  virtual void mix_backward(float* dw, int64_t table_base, const float* de, int64_t N, int64_t K) = 0;
  // JTok-M's exchanges, split (optional; default: nothing, mix() and mix_backward() do all). The
  // router reads the layer's attention input, so the forward knows a layer's routing (ids, sel, w)
  // before its attention: it announces it with mix_post() there, and the provider may start the
  // exchange while attention and MLP run; mix() with the same arguments at the layer's write-back
  // (eq. 10) completes it. Likewise dL/de is known at the start of a layer's backward and dL/dw is
  // needed only after its attention backward: mix_backward_post(), then mix_backward(). Every
  // mix_post is followed by its mix (and mix_backward_post by its mix_backward) before the next
  // layer's; the arrays stay untouched in between.
  virtual void mix_post(int64_t table_base, const int32_t* ids, const int32_t* sel, const float* w, int64_t N,
                        int64_t K) {}
  virtual void mix_backward_post(int64_t table_base, const float* de, int64_t N, int64_t K) {}
  // JTok: every JTok layer of a forward reads the same ids (the micro-batch's unique ids), so the
  // forward announces them once, before its first layer, and the provider may fetch the rows of
  // every JTok table at once (non-blocking) while the backbone runs; rows() then hands them out.
  // poll() is called at every layer boundary of the forward and of the backward, and around each
  // layer's attention (forward and backward), so posted exchanges move on (row_grads may post its exchange and
  // return: the provider completes it before it reads the gradients). Both optional (default:
  // nothing; rows() fetches when called).
  virtual void prefetch(const RowBatch& rb) {}
  virtual void poll() {}
};

// The distinct ids of a micro-batch, sorted, with each position's index into them and, per unique
// id, the list of its positions (CSR), so the backward can sum per row without atomics.
struct RowBatch {
  std::vector<int32_t> unique;     // (U) sorted distinct ids
  std::vector<int32_t> inverse;    // (N) position -> index into unique
  std::vector<int32_t> offsets;    // (U+1) positions of unique[u] are order[offsets[u]..offsets[u+1])
  std::vector<int32_t> order;      // (N) positions grouped by unique id
};
// ids (N) in [0, V).
RowBatch dedup_ids(const int32_t* ids, int64_t N, int64_t V);

// Announces that rows ids[0..n) of t will be read soon. For a read-only view (a memory-mapped file)
// the kernel is asked to start reading their pages now (madvise MADV_WILLNEED: asynchronous, all
// rows at once instead of one page fault at a time when the gather reaches them); for a disk table
// the store's I/O threads start reading the ids' rows not cached (DiskRows::prefetch: every table
// of the store at once, one block per token); for RAM tables it does nothing. Values are
// never changed. Returns the rows announced (a view), the blocks queued (a disk table), or 0 (RAM).
int64_t prefetch_rows(const TokenTable& t, const int32_t* ids, int64_t n);

// Fails with the first read that failed (EIO, a short read) in a disk table's store since the last
// call, naming the file, the token and the byte offset (DiskRows::take_error: the gathers, which
// run in parallel loops, give zeros for such a row and go on). Called after each forward; the error
// is then cleared, so a server answers that request with it and goes on serving.
void check_table_reads(const std::vector<TokenTable>& tables);

// The one gather: out (n, dim) = the rows of ids (each held by t, else it fails naming the id), in
// f32 whatever the storage (RAM, view, bf16, int8, int4, a rank's shard). sync (optional): called with
// (table, the id's row in t) before the row is read; `table` is the caller's index of t (Model::tables).
void gather_rows(float* out, const TokenTable& t, const int32_t* ids, int64_t n, const RowSync& sync = {},
                 int64_t table = 0);
// The same gather into bf16 (a device's staging, cuda/row_staging.h): a bf16 table's rows as stored
// (its bytes, or a disk store's raw read: one pass, no f32 row between), any other storage's f32
// rows rounded to nearest even (quantize_bf16_row), row by row.
void gather_rows_bf16(uint16_t* out, const TokenTable& t, const int32_t* ids, int64_t n);
// The plain reference: one element at a time (table_element_ref), serial.
void gather_rows_ref(float* out, const TokenTable& t, const int32_t* ids, int64_t n);
// The one scatter: the rows of ids (each held by t) = rows (n, dim). f32 writable storage only.
void scatter_rows(TokenTable& t, const int32_t* ids, const float* rows, int64_t n);
void scatter_rows_ref(TokenTable& t, const int32_t* ids, const float* rows, int64_t n);
// JTok: out (U, dim) = the rows of rb.unique (gather_rows).
inline void gather_unique_rows(float* out, const TokenTable& t, const RowBatch& rb, const RowSync& sync = {},
                               int64_t table = 0) {
  gather_rows(out, t, rb.unique.data(), static_cast<int64_t>(rb.unique.size()), sync, table);
}
inline void gather_unique_rows_ref(float* out, const TokenTable& t, const RowBatch& rb) {
  gather_rows_ref(out, t, rb.unique.data(), static_cast<int64_t>(rb.unique.size()));
}

// Row-sparse gradient of one table, accumulated over micro-batches: rows keyed by id.
struct SparseRowGrad {
  int64_t dim = 0;
  std::vector<int32_t> ids;       // (R) ids with a gradient, in insertion order
  std::vector<float> rows;        // (R, dim)
  std::vector<int32_t> slot;      // (V) id -> row index in ids/rows, or -1
  void init(int64_t vocab_rows, int64_t d);
  void clear();
  float* row(int32_t id);         // the id's gradient row, created zeroed on first use
  double sum_squares() const;
};

// The dense (rows, dim) gradient a sparse one stands for (tests and parity dumps only).
std::vector<float> densify(const SparseRowGrad& g, int64_t rows);

}  // namespace jtok
