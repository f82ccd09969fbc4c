// The token tables' optimizer work on two side streams beside the model's (train config
// `table_streams`, --device cuda only):
// - "step": a step's table AdamW (cuda/table_adamw.h), a launch per layer's run of tables with an
//   event after each, behind the step's clip coefficient and touched list; it runs under the flat
//   AdamW and the next step's start;
// - "sync": the next forward's row syncs (the deferred rows of the batch's ids brought current),
//   begun as soon as the ids are deduplicated, table k's behind its layer's step;
// the model's stream waits for table k just before a layer reads it (DeviceActs::row_wait), and for
// both streams before the backward writes the tables' gradients and flags (join). Each row sees the
// same operations in the same order as on one stream: the same bits. Both streams are non-blocking
// (the model's stream is the legacy one, whose implicit barrier would put them back in line) and of
// the greatest priority (the side work is what a later layer waits for).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "cuda/device_array.h"

namespace jtok::cuda {

class TableStreams {
 public:
  // Tables [k0, k1) read by one layer (k Vp + r: row r of table k in the touched list's numbering).
  struct Run {
    int64_t layer = 0, k0 = 0, k1 = 0;
  };
  // The tables grouped by the layer reading them (cuda/model.h's jtok_table and jtokm_table, the
  // latter's n_e tables consecutive), each layer's as runs of consecutive tables, layer by layer.
  TableStreams(const std::vector<int>& jtok_table, const std::vector<int>& jtokm_table, int64_t n_e, int64_t n_tables,
               int64_t Vp);
  ~TableStreams();  // after its streams' work
  TableStreams(const TableStreams&) = delete;
  TableStreams& operator=(const TableStreams&) = delete;

  const std::vector<Run>& runs() const { return runs_; }
  // The step stream behind main's work so far (the clip coefficient, the touched list rows[0 ..
  // *count)), each run's span of that list found (on main). Returns the step stream.
  cudaStream_t begin_step(cudaStream_t main, const int32_t* rows, const int32_t* count);
  // Run r's span of the touched list on the device: span(r)[0] its first position, span(r)[1] its end.
  const int32_t* span(size_t r) const { return spans_.get() + 2 * r; }
  void end_run(size_t r);  // run r's tables stepped: its layer's event
  // The sync stream behind main's work so far (the batch's dedup) and table k's layer step. Returns it.
  cudaStream_t begin_sync(cudaStream_t main, int64_t k);
  void end_sync(int64_t k);                 // table k's rows of the batch current: its event
  void wait(cudaStream_t main, int64_t k);  // main waits for table k's rows (end_sync's event)
  void join(cudaStream_t main);             // main waits for everything queued on both streams

 private:
  cudaStream_t step_ = nullptr, sync_ = nullptr;
  std::vector<Run> runs_;
  std::vector<int64_t> layer_of_;     // (n_tables) the layer reading table k
  std::vector<cudaEvent_t> stepped_;  // per layer: its tables' last step
  std::vector<cudaEvent_t> synced_;   // per table: its rows of the last batch current
  cudaEvent_t main_at_ = nullptr, step_done_ = nullptr, sync_done_ = nullptr;
  DeviceArray<int32_t> bounds_, spans_;  // (2 runs): k0 Vp, k1 Vp; their positions in the touched list
};

}  // namespace jtok::cuda
