// The exact deferred table AdamW of src/train/table_optimizer.h on the GPU ("dense" semantics:
// torch.optim.AdamW over a dense table whose rows without a gradient have a zero one, run
// deferred): a step updates only the rows with a gradient, after replaying the zero-gradient steps
// each missed with that step's kept constants; every other row is brought current when read
// (table_sync_rows, before a gather) or all at once (table_sync_all, before the whole table is read
// or written). A row never trained (zero moments) replays as one multiply a step. Each row keeps
// its step count. "sparse" (lazy) semantics: the rows with a gradient only, nothing replayed.
// Element for element the CPU's arithmetic (adamw_element.cuh); one block a row, no atomics but the
// integer statistics. A step visits only the rows it lists (a gradient's touched rows).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/adamw.h"
#include "cuda/dedup.h"

namespace jtok::cuda {

// One table's optimizer state on the device, rows x d.
struct DeviceTable {
  float* p = nullptr;               // (rows, d) fp32 master values
  __nv_bfloat16* p_bf16 = nullptr;  // (rows, d) the forward's bf16 copy, rewritten with p (null: none)
  float* m = nullptr;               // (rows, d) moments
  float* v = nullptr;
  int32_t* row_step = nullptr;      // (rows) optimizer steps applied to the row
  int64_t rows = 0, d = 0;
};

// The constants of the kept steps: consts[s - base - 1] is step s's, for s in base+1 .. current.
// current == base: nothing deferred (every row current, or lazy semantics).
struct KeptConsts {
  const AdamWConsts* consts = nullptr;  // device array
  int64_t base = 0, current = 0;
};

// Statistics (device, kTableStats x unsigned long long, null: none): rows replayed, of them warm
// (non-zero moments), the steps the warm ones replayed, rows a step updated with a gradient, and
// rows asked outside the kept steps (a bug: the caller checks it is 0, as the CPU aborts on it).
constexpr int kTableStats = 5;
struct TableStats {
  unsigned long long* counters = nullptr;
};

// A step's table gradient as the backward left it (jtok.h, jtokm.h).
struct TableGrad {
  float* g = nullptr;          // (rows, d) fp32: the flagged rows hold the step's gradient, the others stale values
  uint8_t* touched = nullptr;  // (rows) 1 where a row has a gradient this step; the step clears the listed ones
  // The listed rows zeroed too: where the backward adds into rows by atomics (an identity batch, training's
  // table_dedup false), which must be zero where not flagged. Otherwise the next step's first gradient of
  // a row is written over it, and the 4 bytes an element of zeroing are saved.
  bool zero_rows = false;
};

// Step `step` (1-based) with the gradient g.g (rows, d) fp32 at the listed rows ids[0 .. *count)
// (distinct: cuda/table_rows.h's touched list; count null: n; n bounds the count and sizes the
// launch): dense: each replayed to step - 1 (kept.current must be step: this step's constants
// pushed), then updated; lazy: updated only. row_step = step. grad_scale: the clip coefficient on the
// device (null: 1). The listed rows' touched flags are cleared (ready for the next step), their
// gradient rows zeroed with g.zero_rows. The work and traffic are the listed rows' only. first (device,
// null: 0): the rows are ids[*first .. *count), a span of a longer list (cuda/table_rows.h's
// touched_positions: count then points at the span's end).
void table_adamw_step(const DeviceTable& t, const TableGrad& g, const int32_t* ids, const int32_t* count, int64_t n,
                      const KeptConsts& kept, int64_t step, bool dense, const float* grad_scale, TableStats stats,
                      cudaStream_t stream, const int32_t* first = nullptr);

// The rows ids[0 .. *count) (distinct: a DeviceRowBatch's unique and num_unique; count null: n), of
// them the entries in `subset` (default: all), brought current to kept.current: the readers' hook
// before a gather. tables > 1: the same ids in `tables` consecutive tables of table_rows rows each
// from t (t's arrays hold them all, rows apart: cuda/model.h's layout), in one launch; table j's
// entries are subset's bit subset.bit + j.
void table_sync_rows(const DeviceTable& t, const int32_t* ids, const int32_t* count, int64_t n, const KeptConsts& kept,
                     TableStats stats, cudaStream_t stream, RowSubset subset = {}, int64_t tables = 1,
                     int64_t table_rows = 0);

// Every row current to kept.current (then the caller drops the kept constants: base = current).
void table_sync_all(const DeviceTable& t, const KeptConsts& kept, TableStats stats, cudaStream_t stream);

}  // namespace jtok::cuda
