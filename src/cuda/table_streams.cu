// The tables' side streams (src/cuda/table_streams.h).
#include <algorithm>
#include <limits>

#include "cuda/check.h"
#include "cuda/table_rows.h"
#include "cuda/table_streams.h"

namespace jtok::cuda {

namespace {

cudaEvent_t make_event() {
  cudaEvent_t e = nullptr;
  JTOK_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

// Each layer's tables, ascending, cut where they stop being consecutive.
std::vector<TableStreams::Run> layer_runs(const std::vector<int>& jtok_table, const std::vector<int>& jtokm_table,
                                          int64_t n_e) {
  std::vector<TableStreams::Run> runs;
  for (size_t l = 0; l < jtok_table.size(); ++l) {
    std::vector<int64_t> ks;
    if (jtok_table[l] >= 0) ks.push_back(jtok_table[l]);
    if (l < jtokm_table.size() && jtokm_table[l] >= 0)
      for (int64_t i = 0; i < n_e; ++i) ks.push_back(jtokm_table[l] + i);
    std::sort(ks.begin(), ks.end());
    for (size_t i = 0; i < ks.size(); ++i) {
      if (i > 0 && ks[i] == runs.back().k1)
        runs.back().k1 += 1;
      else
        runs.push_back({static_cast<int64_t>(l), ks[i], ks[i] + 1});
    }
  }
  return runs;
}

}  // namespace

TableStreams::TableStreams(const std::vector<int>& jtok_table, const std::vector<int>& jtokm_table, int64_t n_e,
                           int64_t n_tables, int64_t Vp)
    : runs_(layer_runs(jtok_table, jtokm_table, n_e)), layer_of_(static_cast<size_t>(n_tables), -1) {
  JTOK_CHECK(n_tables * Vp <= std::numeric_limits<int32_t>::max(), "table streams: ", n_tables, " tables of ", Vp,
             " rows do not fit the int32 touched list");
  std::vector<int32_t> bounds;
  for (const Run& r : runs_) {
    for (int64_t k = r.k0; k < r.k1; ++k) {
      JTOK_CHECK(k >= 0 && k < n_tables && layer_of_[static_cast<size_t>(k)] < 0, "table streams: table ", k,
                 " of layer ", r.layer, " is out of range or read by two layers");
      layer_of_[static_cast<size_t>(k)] = r.layer;
    }
    bounds.push_back(static_cast<int32_t>(r.k0 * Vp));
    bounds.push_back(static_cast<int32_t>(r.k1 * Vp));
  }
  bounds_.resize(static_cast<int64_t>(bounds.size()));
  spans_.resize(static_cast<int64_t>(bounds.size()));
  copy_to_device(bounds_.get(), bounds.data(), static_cast<int64_t>(bounds.size()));
  // The greatest priority: their blocks go first as SMs free up, so a layer's tables are done
  // before the model's stream gets there (the work is the same; only who waits changes).
  int least = 0, greatest = 0;
  JTOK_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  JTOK_CUDA_CHECK(cudaStreamCreateWithPriority(&step_, cudaStreamNonBlocking, greatest));
  JTOK_CUDA_CHECK(cudaStreamCreateWithPriority(&sync_, cudaStreamNonBlocking, greatest));
  stepped_.resize(jtok_table.size());
  for (cudaEvent_t& e : stepped_) e = make_event();
  synced_.resize(static_cast<size_t>(n_tables));
  for (cudaEvent_t& e : synced_) e = make_event();
  main_at_ = make_event();
  step_done_ = make_event();
  sync_done_ = make_event();
}

TableStreams::~TableStreams() {
  for (cudaStream_t s : {step_, sync_}) {
    if (!s) continue;
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  for (const std::vector<cudaEvent_t>* v : {&stepped_, &synced_})
    for (cudaEvent_t e : *v) cudaEventDestroy(e);
  for (cudaEvent_t e : {main_at_, step_done_, sync_done_}) cudaEventDestroy(e);
}

cudaStream_t TableStreams::begin_step(cudaStream_t main, const int32_t* rows, const int32_t* count) {
  touched_positions(spans_.get(), rows, count, bounds_.get(), bounds_.size(), main);
  JTOK_CUDA_CHECK(cudaEventRecord(main_at_, main));
  JTOK_CUDA_CHECK(cudaStreamWaitEvent(step_, main_at_, 0));
  return step_;
}

void TableStreams::end_run(size_t r) {
  JTOK_CUDA_CHECK(cudaEventRecord(stepped_[static_cast<size_t>(runs_[r].layer)], step_));
}

cudaStream_t TableStreams::begin_sync(cudaStream_t main, int64_t k) {
  JTOK_CUDA_CHECK(cudaEventRecord(main_at_, main));
  JTOK_CUDA_CHECK(cudaStreamWaitEvent(sync_, main_at_, 0));
  JTOK_CUDA_CHECK(cudaStreamWaitEvent(sync_, stepped_[static_cast<size_t>(layer_of_[static_cast<size_t>(k)])], 0));
  return sync_;
}

void TableStreams::end_sync(int64_t k) { JTOK_CUDA_CHECK(cudaEventRecord(synced_[static_cast<size_t>(k)], sync_)); }

void TableStreams::wait(cudaStream_t main, int64_t k) {
  JTOK_CUDA_CHECK(cudaStreamWaitEvent(main, synced_[static_cast<size_t>(k)], 0));
}

void TableStreams::join(cudaStream_t main) {
  JTOK_CUDA_CHECK(cudaEventRecord(step_done_, step_));
  JTOK_CUDA_CHECK(cudaEventRecord(sync_done_, sync_));
  JTOK_CUDA_CHECK(cudaStreamWaitEvent(main, step_done_, 0));
  JTOK_CUDA_CHECK(cudaStreamWaitEvent(main, sync_done_, 0));
}

}  // namespace jtok::cuda
