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
#include <vector>

#include "ops/adamw.h"

namespace jtok {

// A table is a view of rows x dim floats over its storage: its own RAM (a std::vector, writable:
// the trainer updates it), or a read-only region owned by something else (a memory-mapped
// checkpoint file: the rows are read in place, only touched pages become resident). Readers use
// data() / row() / values(); writers mutable_*(), which fail on a read-only view. Copying a RAM
// table copies its rows; copying a view shares the owner (it stays read-only).
// A rank's shard (issue 11) is a RAM table of the rows that rank holds; mapping a global id to a
// local row is the caller's business (rows/dim describe what this storage holds).
class TokenTable {
 public:
  int64_t rows = 0, dim = 0;  // set by the factories; read freely, never reassign

  TokenTable() = default;
  // Writable RAM storage of rows x dim zeros, or of `values` (size rows * dim, checked).
  static TokenTable in_ram(int64_t rows, int64_t dim);
  static TokenTable in_ram(int64_t rows, int64_t dim, std::vector<float> values);
  // Read-only view of rows x dim floats at `data`, kept alive by `owner` (e.g. a MappedFile).
  static TokenTable view(int64_t rows, int64_t dim, const float* data, std::shared_ptr<const void> owner);
  // A shape without storage, for a loader to replace with a view (data() is null; writes fail).
  static TokenTable unbound(int64_t rows, int64_t dim);

  bool read_only() const { return owner_ != nullptr; }
  int64_t numel() const { return rows * dim; }
  const float* data() const { return owner_ ? view_ : ram_.data(); }
  const float* row(int64_t r) const { return data() + r * dim; }
  std::span<const float> values() const { return {data(), static_cast<size_t>(numel())}; }
  float* mutable_data();  // fails (naming the table's shape) on a read-only view or an unbound table
  float* mutable_row(int64_t r) { return mutable_data() + r * dim; }
  std::span<float> mutable_values() { return {mutable_data(), static_cast<size_t>(numel())}; }
  std::vector<float> to_vector() const { return {data(), data() + numel()}; }

 private:
  std::vector<float> ram_;               // RAM storage (empty for a view)
  const float* view_ = nullptr;          // a view's rows
  std::shared_ptr<const void> owner_;    // keeps a view's storage alive; null for RAM
};

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
  // JTok: every JTok layer of a forward reads the same ids (the micro-batch's unique ids), so the
  // forward announces them once, before its first layer, and the provider may fetch the rows of
  // every JTok table at once (non-blocking) while the backbone runs; rows() then hands them out.
  // poll() is called at every layer boundary of the forward so such exchanges move on. Both
  // optional (default: nothing; rows() fetches when called).
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
// rows at once instead of one page fault at a time when the gather reaches them); for RAM tables it
// does nothing. Values are never changed. Returns the number of rows announced (0 for RAM).
int64_t prefetch_rows(const TokenTable& t, const int32_t* ids, int64_t n);

// out (U, dim) = table rows of rb.unique. sync (optional): called for (table, each id) before its
// row is read; `table` is t's index in Model::tables.
void gather_unique_rows(float* out, const TokenTable& t, const RowBatch& rb, const RowSync& sync = {},
                        int64_t table = 0);

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

// AdamW over a whole table with exact dense semantics: rows without a gradient still have their
// moments decayed and receive the update from those moments and the weight decay, exactly as
// torch.optim.AdamW over a dense table with zero gradient rows. One pass over the table.
// m, v: the table's AdamW moments, (rows, dim).
void table_adamw_dense_semantics(TokenTable& t, float* m, float* v, const SparseRowGrad& g, const AdamWHyper& h);
// Lazy ("sparse") AdamW: only the rows with a gradient this step are touched (their moments, their
// bias-corrected update at the global step, their weight decay); the other rows keep their values
// and moments exactly. Not torch.optim.AdamW's semantics (table_optimizer = "sparse", docs/jtok.md):
// the price of a dense pass over V x d per table every step is gone.
void table_adamw_sparse_rows(TokenTable& t, float* m, float* v, const SparseRowGrad& g, const AdamWHyper& h);
// The reference: materialises the dense gradient and runs the dense AdamW.
void table_adamw_ref(TokenTable& t, float* m, float* v, const SparseRowGrad& g, const AdamWHyper& h);
// The dense (rows, dim) gradient a sparse one stands for (tests and parity dumps only).
std::vector<float> densify(const SparseRowGrad& g, int64_t rows);

}  // namespace jtok
