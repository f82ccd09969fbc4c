// Token-table rows read by the GPU in place (issue 40, the paper's CPU offloading): a table kept in
// host memory is page-locked where it lies (cudaHostRegister of exactly its rows' bytes: no pinned
// pool, never a copy of the table on the device) and a gather kernel reads a batch's deduplicated
// rows over UVA (16-byte loads) into a device buffer of the model's activation type.
//   rows (V, d) f32 or bf16, in host (registered) or device memory; rb.unique (U) ->
//   out (U, d) of T (float or __nv_bfloat16)
// The same kernel reads a device copy of a table (the HBM control, bench/cuda_host_rows.cpp).
// The staged path (rows gathered on the host, copied on a side stream) is cuda/row_staging.h.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "cuda/dedup.h"
#include "model/token_table.h"

namespace jtok::cuda {

// Rows (rows, dim) of dtype (f32 or bf16), contiguous, at `data`: a device pointer, or the device
// view of registered host memory (register_table_rows).
struct RowSource {
  const void* data = nullptr;
  int64_t rows = 0, dim = 0;
  Dtype dtype = Dtype::f32;
};

// Page-locks t's rows where they lie (cudaHostRegister, mapped, read-only where the device allows:
// a memory-mapped file's pages are read-only) and returns the GPU's view of them. Only a whole table
// (ids 0..rows-1) of f32 or bf16 rows in memory (RAM or a mapped file); an int8 / int4 table, a disk
// table, an unbound table or a rank's shard fails naming what it is. `what` names the table in the
// errors. Registering the same table again adds a reference (no second cudaHostRegister); bytes that
// overlap another registration without being the same bytes fail. t's storage must outlive its
// registration (freeing pinned bytes before cudaHostUnregister is undefined).
RowSource register_table_rows(const TokenTable& t, const char* what = "token table");
// Drops one reference to t's registration; the last one unregisters the bytes. Returns false (and
// does nothing) when t's bytes are not registered here.
bool unregister_table_rows(const TokenTable& t);
// References held on t's bytes (0: not registered by register_table_rows).
int64_t table_rows_registrations(const TokenTable& t);

// One table registered for as long as the object lives (register_table_rows / unregister_table_rows).
class RegisteredRows {
 public:
  RegisteredRows() = default;
  RegisteredRows(const TokenTable& t, const char* what = "token table")
      : table_(&t), source_(register_table_rows(t, what)) {}
  RegisteredRows(const RegisteredRows&) = delete;
  RegisteredRows& operator=(const RegisteredRows&) = delete;
  RegisteredRows(RegisteredRows&& o) noexcept : table_(o.table_), source_(o.source_) { o.table_ = nullptr; }
  RegisteredRows& operator=(RegisteredRows&& o) noexcept;
  ~RegisteredRows() { release(); }
  void release() noexcept;  // idempotent
  const RowSource& source() const { return source_; }

 private:
  const TokenTable* table_ = nullptr;
  RowSource source_;
};

// Ids outside a source's rows met by gather_rows_device: count, largest id >= rows, smallest id < 0
// (device int32 (3), order-independent atomics). Reset before a batch; read after it
// (check_row_errors). Rows of such ids are written as zeros.
struct RowErrors {
  int32_t* words = nullptr;  // (3) device: count, max id >= rows (-1: none), min id < 0 (0: none)
};
void reset_row_errors(const RowErrors& e, cudaStream_t stream);
// Synchronises stream; fails naming `what`, the count and the ids out of range if any were met.
void check_row_errors(const RowErrors& e, int64_t rows, const char* what, cudaStream_t stream);

// src (V, d) f32 or bf16, rb (the batch's deduplicated ids; N its bound) -> out (N bound, d) of T:
// row u < U = *rb.num_unique is src's row rb.unique[u] (f32 -> bf16 rounds to nearest even, bf16 ->
// f32 is exact, same type copies the bits). 16-byte loads when src's and out's rows are 16-byte
// aligned, else one element a thread (gather_rows_device_ref's path). errors: may be null (then an
// id out of range is a zero row, unreported).
template <typename T>
void gather_rows_device(T* out, const RowSource& src, const DeviceRowBatch& rb, int64_t N, const RowErrors& errors,
                        cudaStream_t stream);
// The plain reference: one element a thread, no vector loads.
template <typename T>
void gather_rows_device_ref(T* out, const RowSource& src, const DeviceRowBatch& rb, int64_t N, const RowErrors& errors,
                            cudaStream_t stream);

// gather_rows_device for n tables of one shape and dtype (a layer's: JTok's and JTok-M's n_e) in one launch
// per kMaxGatherTables: outs[t] (N bound, d) = srcs[t]'s rows of rb.unique. An id out of range is
// counted once, not once a table.
constexpr int kMaxGatherTables = 16;
template <typename T>
void gather_rows_device_tables(T* const* outs, const RowSource* srcs, int n, const DeviceRowBatch& rb, int64_t N,
                               const RowErrors& errors, cudaStream_t stream);

// Every id of ids (n, host) in [0, rows), else fails naming `what`, the position and the id.
void check_ids_in_range(const int32_t* ids, int64_t n, int64_t rows, const char* what);

}  // namespace jtok::cuda
