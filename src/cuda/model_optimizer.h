// One optimizer step of the device model (cuda/model.h), train/optimizer.cpp's optimizer_step on
// the GPU: the global gradient norm over the flat fp32 gradients and the tables' (cuda/global_norm.h:
// the flat ones' 4096-element chunks, the tables' touched rows), its clip coefficient (kept on the
// device), AdamW per parameter tensor (cuda/adamw.h) with the decoupled weight decay on the 2-D
// weights only (ParamInfo::decay), and the token tables by the exact deferred table AdamW
// (cuda/table_adamw.h: rows with a gradient updated, the others brought current when read, through
// DeviceActs::row_sync). The fp32 masters are updated and, for a bf16 model, the forward's bf16
// copies rewritten.
//
// The tables' per-step cost is the touched rows', never the whole tables': with U rows touched by the
// step (over all tables, cuda/table_rows.h's list), R = n_tables Vp rows and width d, a step moves
//   2 R          the flags read by the compaction (here and in zero_grads)
// + U (4 + 4 d)  the list and the norm's read of the touched gradient rows
// + U 30 d       the table AdamW: gradient read 4 d, p m v read 12 d and written 12 d, the bf16
//                copy 2 d (bf16 models); the gradient row is not zeroed (the backward writes a
//                row's first gradient of a step over it: model.h), but for table_dedup false (+4 d)
// + U 13         row steps, flags, list reads
// bytes, about 2 R + U (34 d + 17) (dense semantics: the rows a step touches were brought current by
// the forward's row syncs, whose replay is the forward's cost). JTok-M on config b (d 768, 60 tables
// of Vp 50304) with 10 % of the rows touched: 6 MB + 7.9 GB, where it was that and 18.5 GB more for
// a memset and a norm pass over the whole (R, d) gradients (2 x 9.3 GB), then 0.9 GB more for zeroing
// the rows (and as much in the backward, reading them before its first add).
//
// An untied, trainable token embedding is stepped the same way (defer_embedding): its gradient's rows
// listed from the backward's flags, replayed and stepped, zeroed after (the backward adds into them),
// the other rows brought current when read (DeviceActs::embed_sync) or by sync_tables. At config b
// (Vp 50,304, d 768, ~2,900 ids a step) that is at most ~0.15 GB (the step's 38 d bytes a touched row,
// the catch-up's 26 d a row behind) where the flat AdamW moved 1.16 GB and the gradient's memset 154 MB;
// the norm still reads the whole span.
#pragma once
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/adamw.h"
#include "cuda/device_array.h"
#include "cuda/model.h"
#include "cuda/table_adamw.h"
#include "cuda/table_streams.h"

namespace jtok::cuda {

// The AdamW constants of the steps not yet replayed into every row of a deferred tensor: steps
// base+1 .. base+host.size(), on the device in dev (cuda/table_adamw.h's KeptConsts).
struct KeptSteps {
  std::vector<AdamWConsts> host;
  DeviceArray<AdamWConsts> dev;     // room for host.size() or more (doubled when full)
  PinnedArray<AdamWConsts> staged;  // dev's size: a step's constants are copied up from their slot
  int64_t base = 0;
  // The next step's, uploaded on stream from pinned memory: the host does not wait (a synchronous
  // copy would wait for the work queued before it, AdamW's among it). A slot is written again only
  // after a reset, and the optimizer step's norm wait lies between: its last copy is done.
  void push(const AdamWConsts& c, cudaStream_t stream);
  void reset(int64_t step) {        // every row current at step: nothing kept
    base = step;
    host.clear();
  }
  KeptConsts view() const { return {dev.get(), base, base + static_cast<int64_t>(host.size())}; }
};

// fp32 moments of every flat parameter and table row, the tables' row steps and the kept constants
// of the steps not yet replayed into every row, and the norm's scratch.
struct DeviceAdamW {
  // Moments zero; dense_tables: the tables' "dense" semantics (torch AdamW over the whole table,
  // deferred and exact), else "sparse" (the rows with a gradient only). defer_embedding: the token
  // embedding stepped as a table with dense semantics where its gradient is row-sparse
  // (DeviceModel::embed_rows_on): the same bits as the flat AdamW's, its rows moved only when they
  // have a gradient or are read (the forward's DeviceActs::embed_sync, sync_tables).
  template <typename E>
  explicit DeviceAdamW(const DeviceModel<E>& dm, bool dense_tables = true, bool defer_embedding = true);
  DeviceArray<float> m, v;                // (n_params), m.params' layout
  // The trainable tensors of the flat parameters as AdamW's segments (cuda/adamw.h; kinds: decay,
  // plain, table decay, table plain): the whole step in one launch (a deferred embedding is in none).
  DeviceArray<AdamWSegment> segments;
  int64_t segment_blocks = 0;
  DeviceArray<float> table_m, table_v;    // (n_tables, Vp, d)
  DeviceArray<int32_t> row_step;          // (n_tables, Vp) steps applied to each row
  KeptSteps kept;                         // the tables' (table decay constants)
  bool dense_tables = true;
  // The deferred embedding: its rows' steps and its kind's kept constants (its moments stay in m, v).
  bool defer_embedding = false;
  int embed_kind = 0;                   // AdamWKinds' index of the embedding: 0 decay, 1 plain
  DeviceArray<int32_t> embed_row_step;  // (Vp)
  KeptSteps embed_kept;
  // The backward adds table gradients by atomics into rows that must be zero where not flagged
  // (DeviceActs::table_dedup false): the table AdamW zeroes the rows it used (TableGrad::zero_rows).
  bool zero_table_grad_rows = false;
  DeviceArray<float> partials;            // (sumsq_chunks(n_params) + sumsq_chunks(table elements))
  DeviceArray<double> sumsq, norm;        // (1), (1)
  DeviceArray<float> clip;                // (1) the clip coefficient AdamW reads
  // (2 kTableStats) cuda/table_adamw.h's TableStats: the tables', then the deferred embedding's.
  DeviceArray<unsigned long long> stats;
  HostReadback readback;                  // the norm and stats read back a step (pinned)
  // The stats as last read back: rows replayed, of them warm, their steps; rows stepped.
  std::array<unsigned long long, 4> counts{};
  int64_t step = 0;                       // steps taken
  std::unique_ptr<TableStreams> streams;  // the table work's side streams (use_table_streams), or none

  KeptConsts kept_view() const { return kept.view(); }
  unsigned long long* embed_stats() const { return stats.get() + kTableStats; }
};

// max_grad_norm <= 0: no clipping. The norm is read back (one sync): a non-finite one fails before any
// weight, moment or gradient moves, as on the CPU (the tables' touched rows stay flagged: zero_grads,
// at the next step's start, clears them). Returns the gradient norm. The flat gradients are left as
// they are; the tables' touched gradient rows and flags are cleared (table_adamw_step).
template <typename E>
double optimizer_step(DeviceModel<E>& dm, DeviceAdamW& st, const StepConsts& c, float max_grad_norm);

// The hook a training forward sets as DeviceActs::row_sync: the rows the batch will gather (of a
// JTok-M table, the pairs its routing chose: the RowSubset) brought current (dense semantics; empty for sparse: nothing
// is deferred, unless on side streams, where the hook queues the wait for the table's step). It refers to dm and st: it
// must not outlive them.
template <typename E>
DeviceRowSync table_row_sync(DeviceModel<E>& dm, DeviceAdamW& st);
// The hook a training forward sets as DeviceActs::embed_sync: the embedding's rows of the batch
// brought current (empty unless st.defer_embedding). It refers to dm and st: it must not outlive them.
template <typename E>
DeviceEmbedSync embedding_row_sync(DeviceModel<E>& dm, DeviceAdamW& st);
// DeviceActs::row_wait's: the model's stream waits for the side streams' work on a table (empty
// without side streams).
template <typename E>
DeviceRowWait table_row_wait(DeviceModel<E>& dm, DeviceAdamW& st);

// The table AdamW and the row syncs on side streams from now on (cuda/table_streams.h; a model
// without tables: nothing changes). Set the hooks (table_row_sync, table_row_wait) after this.
template <typename E>
void use_table_streams(const DeviceModel<E>& dm, DeviceAdamW& st);
// The model's stream waits for the side streams' work (before the tables' gradients, values or
// flags are written or read whole: the backward, a checkpoint). A no-op without side streams.
template <typename E>
void join_table_streams(const DeviceModel<E>& dm, DeviceAdamW& st);

// Every table row and every row of a deferred embedding current (before the whole tables or weights
// are read: a copy back, a checkpoint); their kept constants dropped (under sparse semantics nothing
// is deferred); the stats read back (counts). eager_pass: training's dense-eager pass a step (the
// naive table optimizer): the tables alone (the embedding stays deferred), and no wait of its own
// (the stats are cumulative: the next step's norm read checks them).
template <typename E>
void sync_tables(DeviceModel<E>& dm, DeviceAdamW& st, bool eager_pass = false);

}  // namespace jtok::cuda
