// A step's token-table rows for every layer, requested as soon as the step's ids are known (issue 40):
// JTok's rows depend only on the ids and JTok-M's candidates are the n_e rows of each id, so one
// request issues every layer's gathers on a side stream, in layer order, with one event per layer;
// the consumer (the decoder's stream) waits for layer l's event just before layer l. No host round
// trip on the consumer's path, no page fault inside a kernel (the rows are pinned or staged).
//   ids (N <= max_n, host) -> rb (device dedup of ids), per layer l and table i of l:
//   rows(l, i) (U, d) of T = table's rows of rb.unique (U = *rb.num_unique)
// Two paths (issue 40: chosen by measurement): in place (host_rows.h: the tables registered where
// they lie, read by the gather kernel over UVA; f32 / bf16 tables in memory) and staged
// (row_staging.h: gathered on the host into pinned staging and copied; any table the CPU reads);
// and the control, hbm: a device copy of every table in T made once (the host's gather, any
// storage; bf16 rounded to nearest even as the other paths round), gathered by the same kernel as
// in place. The three give the same bits.
// Staged, the host's gathers are host functions on the side stream (cudaLaunchHostFunc, run on
// CUDA's callback thread), so request() only queues: per layer k, [gather layer k's tables' rows
// of the request's unique ids into its pinned staging] -> [a copy a table] -> [layer k's event].
// The caller queues its forward at once and the gathers overlap it. A host function calls no CUDA
// API and cannot throw: its error (a gather that threw, a disk store's failed read) is kept and
// thrown by check_error(), which the consumer calls after its sync.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/dedup.h"
#include "cuda/device_array.h"
#include "cuda/host_rows.h"
#include "cuda/row_staging.h"
#include "model/transformer.h"

namespace jtok::cuda {

enum class RowPath { in_place, staged, hbm };
const char* row_path_name(RowPath p);  // "in_place", "staged", "hbm"

// The tables one layer reads, in order: its JTok table, then its JTok-M tables (n_e, consecutive).
struct LayerTables {
  int64_t layer = 0;
  std::vector<const TokenTable*> tables;
};
// m's layers that read tables, in layer order (layers with none are left out).
std::vector<LayerTables> layer_tables(const Model& m);

template <typename T>
class StepRows {
 public:
  // Every table: the same rows (V) and dim (d), else it fails naming the layer. max_n: the most ids a
  // step brings. in_place registers every table (register_table_rows: f32 / bf16 in memory only);
  // hbm copies every table to the device (rows x d of T each).
  StepRows(std::vector<LayerTables> layers, int64_t max_n, RowPath path);
  ~StepRows();
  StepRows(const StepRows&) = delete;
  StepRows& operator=(const StepRows&) = delete;

  // ids (N, host; each in [0, V), else it fails naming the position and id, before anything is
  // queued): after the work queued on `consumer` so far (the previous step's reads of the rows),
  // uploads and deduplicates the ids and issues every layer's gathers on the side stream, recording
  // layer k's event after its last table. Staged: the ids' host dedup runs here, the gathers are
  // host functions queued on the side stream (nothing waits for them here). The side stream is in
  // order: a layer's staging is rewritten only after its previous copy, a slot only after the
  // consumer's work queued before this request (the previous step's reads).
  void request(const int32_t* ids, int64_t N, cudaStream_t consumer);
  // Staged: waits for the last request's host gathers (normally already done: call it after a
  // sync of the consumer that follows its wait for every layer) and throws the first error they
  // met as a jtok::Error naming the layer and table, once. A failed request's rows are zeros from
  // the failing layer on (not gathered; what the consumer computed from them is to be dropped). An
  // unchecked error is dropped when a later request takes its ring entry. Other paths: nothing
  // (their ids were checked before anything was queued).
  void check_error();
  // The same from ids already on the device (N int32, written by work queued on `consumer`; the
  // caller checked them against vocab()): no host copy, no host sync, nothing but stream work and
  // events, so a CUDA graph can capture it (every wait of the consumer on layer k's event then joins
  // the side stream back). Not the staged path (its host gathers need the ids on the host).
  void request_device(const int32_t* dev_ids, int64_t N, cudaStream_t consumer);
  // Work queued on `consumer` from now on starts after layer k's rows (k: index into layers()).
  void wait(int64_t k, cudaStream_t consumer) const;
  // Layer k's table i: (max_n bound, d), the first U rows the rows of batch().unique.
  const T* rows(int64_t k, int64_t i) const;
  // The device dedup of the last request's ids (positions -> unique rows: inverse, offsets, order).
  const DeviceRowBatch& batch() const { return rb_; }
  const std::vector<LayerTables>& layers() const { return layers_; }
  int64_t vocab() const { return V_; }
  int64_t dim() const { return d_; }
  RowPath path() const { return path_; }
  // U of the last request: staged, the host's count; in place, *batch().num_unique read back after
  // the side stream's work (a sync: for checks and benchmarks, not the decoder's path).
  int64_t last_unique() const;
  // Timing events on the side stream (JTOK_PROFILE=1; eager only: not for a captured request): after
  // a request's work is done, the ids' dedup and the gathers (dedup end to the last layer's rows;
  // staged: the host functions' gathers and the copies), ms.
  void enable_timing();
  struct Times {
    double dedup_ms = 0, gather_ms = 0;
  };
  Times last_times() const;  // zeros unless timing is on

 private:
  void check_shapes();
  void upload_and_dedup(const int32_t* ids, int64_t N, cudaStream_t consumer);
  void dedup(const int32_t* dev_ids, int64_t N);
  void mark(cudaEvent_t e) const;  // records e on the side stream when timing is on
  void gather_layer(int64_t k, int64_t N);
  void stage_layer(int64_t k);
  void take_ring_entry(const int32_t* ids, int64_t N);
  void gather_staged(int entry, int64_t k) noexcept;  // a host function's body: no CUDA call
  void fail_request(int entry, int64_t k, size_t i, const std::string& why) noexcept;
  T* slot(int64_t k, int64_t i) const;
  T* staging(int64_t k, int64_t i) const;

  // Staged: a request's host state, read by its host functions; rewritten only after `done` (recorded
  // after its last host function) has completed. A ring of two: the entry before the last is
  // normally long done when the next request takes it.
  static constexpr int kRing = 2;
  struct GatherCall {  // a host function's argument: layer k of ring entry `entry`
    StepRows* self = nullptr;
    int entry = 0;
    int64_t k = 0;
  };
  struct StagedRequest {
    std::vector<int32_t> unique;    // (U) the host's dedup of the ids: sorted, as rb_.unique
    std::vector<GatherCall> calls;  // one a layer
    cudaEvent_t done = nullptr;
    bool failed = false;            // under error_mu_: the first error met, its later layers skipped
    std::string error;
  };

  std::vector<LayerTables> layers_;
  std::vector<int64_t> first_slot_;  // per layer: index of its first table's slot
  int64_t max_n_ = 0, V_ = 0, d_ = 0, slots_ = 0;
  RowPath path_;
  std::vector<RegisteredRows> registered_;  // in place: one per slot
  std::vector<DeviceArray<T>> device_tables_;  // hbm: one per slot
  std::vector<RowSource> sources_;           // in place, hbm: the gather's source of each slot
  DeviceArray<T> out_;                       // (slots, max_n, d)
  PinnedArray<T> staging_;                   // staged: (slots, max_n, d)
  PinnedArray<int32_t> ids_pinned_;          // (max_n)
  DeviceArray<int32_t> ids_, unique_, inverse_, offsets_, order_, num_unique_;
  DeviceArray<char> scratch_;
  DeviceRowBatch rb_;
  cudaStream_t side_ = nullptr;
  cudaEvent_t consumer_mark_ = nullptr, ids_copied_ = nullptr;
  std::vector<cudaEvent_t> ready_;  // per layer
  int64_t last_unique_ = 0;  // staged: the host's U
  std::array<StagedRequest, kRing> ring_;
  int cur_ = -1;  // the last staged request's ring entry (-1: none yet)
  std::mutex error_mu_;
  cudaEvent_t t_begin_ = nullptr, t_dedup_ = nullptr, t_end_ = nullptr;  // timing (null: off)
};

}  // namespace jtok::cuda
