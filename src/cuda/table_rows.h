// The touched-row list of the token tables' gradients: the rows a step gave a gradient, listed from
// their flags by a stream compaction (cub's DeviceSelect::Flagged: stable, exact integer count, the
// same list every run), and those rows' gradients and flags cleared. The per-step table passes
// (the gradient norm's table part, the table AdamW, the clearing) run over this list, so a step
// costs in proportion to the rows it touched, not to the whole tables: the flags are a byte a row.
//   touched (n) uint8 flags, rows (n) int32 bound: the first *count entries hold the flagged
//   indices in ascending order, count (1) int32 on the device (copy it back only if the host needs it).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuda/device_array.h"

namespace jtok::cuda {

// Bytes of scratch select_touched_rows needs for n flags (cub's temporary storage).
size_t touched_rows_scratch_bytes(int64_t n);

// touched (n) -> rows (n bound), count (1): the i with touched[i] != 0, ascending. n < 2^31.
void select_touched_rows(int32_t* rows, int32_t* count, const uint8_t* touched, int64_t n, void* scratch,
                       size_t scratch_bytes, cudaStream_t stream);

// rows[0 .. *count) ascending (select_touched_rows' list), values (n) on the device -> pos (n): the
// first position whose row is not below values[i] (std::lower_bound): the rows of [a, b) lie at
// positions [lower_bound(a), lower_bound(b)).
void touched_positions(int32_t* pos, const int32_t* rows, const int32_t* count, const int32_t* values, int64_t n,
                       cudaStream_t stream);

// g (rows' bound, d) fp32, touched (rows' bound): the rows rows[0 .. *count) (count null: n) zeroed
// and their flags cleared. n: a bound on the count (the launch's size).
void clear_rows(float* g, uint8_t* touched, const int32_t* rows, const int32_t* count, int64_t n, int64_t d,
                cudaStream_t stream);

// A row-sparse gradient's flags and their list: the token tables' (n_tables Vp rows) and an untied
// embedding's (Vp). A backward flags the rows it adds into and sets `flagged`; list() compacts the
// flags for a step's passes over the rows; clear() zeroes the listed rows and their flags.
struct RowFlags {
  DeviceArray<uint8_t> flags;    // (n) 1 where a row got a gradient; empty: the gradient is not row-sparse
  DeviceArray<int32_t> rows;     // (n) bound: the first *count hold the flagged rows, ascending
  DeviceArray<int32_t> count;    // (1)
  DeviceArray<uint8_t> scratch;  // select_touched_rows' scratch
  bool flagged = false;          // a backward flagged rows that no step or clear has cleared since

  void allocate(int64_t n, cudaStream_t stream);  // flags and count zeroed
  int64_t size() const { return flags.size(); }
  size_t bytes() const { return flags.bytes() + rows.bytes() + count.bytes() + scratch.bytes(); }
  void list(cudaStream_t stream);  // flags -> rows[0 .. *count)
  void flag(int64_t row);          // row flagged as a backward flags it (synchronous: fault injection)
  // g (n, d) fp32: the flagged rows listed, zeroed and their flags cleared; flagged false.
  void clear(float* g, int64_t d, cudaStream_t stream);
};

}  // namespace jtok::cuda
