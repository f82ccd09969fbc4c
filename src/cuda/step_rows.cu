// Every layer's token-table rows of a step on a side stream, one event per layer
// (src/cuda/step_rows.h). Host code only: the kernels are host_rows.cu's gather and dedup.cu's.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/decoder_sizes.h"
#include "cuda/step_rows.h"
#include "ops/lowp_convert.h"

namespace jtok::cuda {

const char* row_path_name(RowPath p) {
  switch (p) {
    case RowPath::in_place: return "in_place";
    case RowPath::staged: return "staged";
    case RowPath::hbm: return "hbm";
  }
  return "?";
}

namespace {

// t's rows (whole: ids 0..rows-1) on the device in T: the host's gather (any storage, f32) a block of
// rows at a time, bf16 rounded to nearest even (the staged path's rounding, the gather kernel's).
template <typename T>
DeviceArray<T> upload_table(const TokenTable& t) {
  constexpr int64_t kBlock = 2048;
  DeviceArray<T> out(step_rows_sizes(1, 1, t.rows, t.dim).table);
  std::vector<int32_t> ids;
  std::vector<float> f32;
  std::vector<uint16_t> b16;
  for (int64_t r0 = 0; r0 < t.rows; r0 += kBlock) {
    const int64_t n = std::min(kBlock, t.rows - r0);
    ids.resize(static_cast<size_t>(n));
    std::iota(ids.begin(), ids.end(), static_cast<int32_t>(r0));
    f32.resize(static_cast<size_t>(n * t.dim));
    gather_rows(f32.data(), t, ids.data(), n);
    if constexpr (std::is_same_v<T, float>) {
      copy_to_device(out.get() + r0 * t.dim, f32.data(), n * t.dim);
    } else {
      b16.resize(f32.size());
      quantize_bf16(b16.data(), f32.data(), n * t.dim);
      copy_to_device(reinterpret_cast<uint16_t*>(out.get() + r0 * t.dim), b16.data(), n * t.dim);
    }
  }
  return out;
}

}  // namespace

std::vector<LayerTables> layer_tables(const Model& m) {
  std::vector<LayerTables> out;
  auto at = [](const std::vector<int>& v, int64_t l) {
    return l < static_cast<int64_t>(v.size()) ? v[static_cast<size_t>(l)] : -1;
  };
  for (int64_t l = 0; l < m.cfg.num_hidden_layers; ++l) {
    LayerTables lt{l, {}};
    const int jtok_index = at(m.jtok_table, l), jtokm_first = at(m.jtokm_table, l);
    if (jtok_index >= 0) lt.tables.push_back(&m.tables[static_cast<size_t>(jtok_index)]);
    if (jtokm_first >= 0)
      for (int64_t i = 0; i < m.cfg.jtokm_n_e; ++i)
        lt.tables.push_back(&m.tables[static_cast<size_t>(jtokm_first + i)]);
    if (!lt.tables.empty()) out.push_back(std::move(lt));
  }
  return out;
}

template <typename T>
void StepRows<T>::check_shapes() {
  JTOK_CHECK(!layers_.empty(), "StepRows: no layer reads a token table");
  JTOK_CHECK(max_n_ > 0 && max_n_ < (int64_t{1} << 31), "StepRows: max_n = ", max_n_);
  V_ = layers_[0].tables.at(0)->rows;
  d_ = layers_[0].tables.at(0)->dim;
  for (const LayerTables& lt : layers_) {
    first_slot_.push_back(slots_);
    slots_ += static_cast<int64_t>(lt.tables.size());
    for (const TokenTable* t : lt.tables)
      if (t->rows != V_ || t->dim != d_)
        fail("StepRows: layer ", lt.layer, "'s table is ", t->rows, " x ", t->dim, ", the first layer's ", V_, " x ",
             d_);
  }
}

template <typename T>
StepRows<T>::StepRows(std::vector<LayerTables> layers, int64_t max_n, RowPath path)
    : layers_(std::move(layers)), max_n_(max_n), path_(path) {
  check_shapes();
  registered_.reserve(static_cast<size_t>(slots_));
  for (const LayerTables& lt : layers_)
    for (const TokenTable* t : lt.tables) {
      if (path_ == RowPath::in_place) {
        registered_.emplace_back(*t, ("layer " + std::to_string(lt.layer) + "'s token table").c_str());
        sources_.push_back(registered_.back().source());
      } else if (path_ == RowPath::hbm) {
        device_tables_.push_back(upload_table<T>(*t));
        sources_.push_back({device_tables_.back().get(), V_, d_, std::is_same_v<T, float> ? Dtype::f32 : Dtype::bf16});
      }
    }
  const StepRowsSizes z = step_rows_sizes(slots_, max_n_, V_, d_);  // the decoder's memory plan counts the same
  if (path_ == RowPath::staged) staging_ = PinnedArray<T>(z.out);
  out_.resize(z.out);
  ids_pinned_ = PinnedArray<int32_t>(z.ids);
  ids_.resize(z.ids);
  unique_.resize(z.ids);
  inverse_.resize(z.ids);
  offsets_.resize(z.offsets);
  order_.resize(z.ids);
  num_unique_.resize(1);
  scratch_.resize(static_cast<int64_t>(dedup_scratch_bytes(max_n_, V_)));
  rb_ = DeviceRowBatch{unique_.get(), inverse_.get(), offsets_.get(), order_.get(), num_unique_.get()};
  JTOK_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  JTOK_CUDA_CHECK(cudaEventCreateWithFlags(&consumer_mark_, cudaEventDisableTiming));
  JTOK_CUDA_CHECK(cudaEventCreateWithFlags(&ids_copied_, cudaEventDisableTiming));
  ready_.resize(layers_.size());
  for (cudaEvent_t& e : ready_) JTOK_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  if (path_ != RowPath::staged) return;
  for (int e = 0; e < kRing; ++e) {
    StagedRequest& r = ring_[static_cast<size_t>(e)];
    JTOK_CUDA_CHECK(cudaEventCreateWithFlags(&r.done, cudaEventDisableTiming));
    r.unique.reserve(static_cast<size_t>(max_n_));
    for (int64_t k = 0; k < static_cast<int64_t>(layers_.size()); ++k) r.calls.push_back({this, e, k});
  }
}

template <typename T>
StepRows<T>::~StepRows() {
  if (side_) cudaStreamSynchronize(side_);  // no copy, gather or host function left reading what goes below
  for (cudaEvent_t e : ready_) cudaEventDestroy(e);
  for (StagedRequest& r : ring_)
    if (r.done) cudaEventDestroy(r.done);
  for (cudaEvent_t e : {t_begin_, t_dedup_, t_end_})
    if (e) cudaEventDestroy(e);
  if (ids_copied_) cudaEventDestroy(ids_copied_);
  if (consumer_mark_) cudaEventDestroy(consumer_mark_);
  if (side_) cudaStreamDestroy(side_);
}

template <typename T>
T* StepRows<T>::slot(int64_t k, int64_t i) const {
  return out_.get() + (first_slot_[static_cast<size_t>(k)] + i) * max_n_ * d_;
}

template <typename T>
T* StepRows<T>::staging(int64_t k, int64_t i) const {
  return staging_.get() + (first_slot_[static_cast<size_t>(k)] + i) * max_n_ * d_;
}

template <typename T>
const T* StepRows<T>::rows(int64_t k, int64_t i) const {
  JTOK_CHECK(k >= 0 && k < static_cast<int64_t>(layers_.size()), "StepRows::rows: layer index ", k);
  JTOK_CHECK(i >= 0 && i < static_cast<int64_t>(layers_[static_cast<size_t>(k)].tables.size()),
             "StepRows::rows: table ", i, " of layer index ", k);
  return slot(k, i);
}

template <typename T>
void StepRows<T>::wait(int64_t k, cudaStream_t consumer) const {
  JTOK_CHECK(k >= 0 && k < static_cast<int64_t>(layers_.size()), "StepRows::wait: layer index ", k);
  wait_rows(consumer, ready_[static_cast<size_t>(k)]);
}

// The side stream starts after the consumer's queued work (the previous step's reads of out_), then
// the ids go up through pinned memory (whose previous copy must be done before it is rewritten).
template <typename T>
void StepRows<T>::upload_and_dedup(const int32_t* ids, int64_t N, cudaStream_t consumer) {
  JTOK_CUDA_CHECK(cudaEventSynchronize(ids_copied_));
  std::copy(ids, ids + N, ids_pinned_.get());
  JTOK_CUDA_CHECK(cudaEventRecord(consumer_mark_, consumer));
  JTOK_CUDA_CHECK(cudaStreamWaitEvent(side_, consumer_mark_, 0));
  mark(t_begin_);
  JTOK_CUDA_CHECK(cudaMemcpyAsync(ids_.get(), ids_pinned_.get(), static_cast<size_t>(N) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, side_));
  JTOK_CUDA_CHECK(cudaEventRecord(ids_copied_, side_));
  dedup(ids_.get(), N);
}

// rb_ of dev_ids (N) on the side stream; scratch_ (cub's temporary storage included) was sized for
// max_n at construction, so nothing is allocated here.
template <typename T>
void StepRows<T>::dedup(const int32_t* dev_ids, int64_t N) {
  dedup_ids(rb_, dev_ids, N, V_, scratch_.get(), static_cast<size_t>(scratch_.size()), side_);
  mark(t_dedup_);
}

template <typename T>
void StepRows<T>::mark(cudaEvent_t e) const {
  if (e) JTOK_CUDA_CHECK(cudaEventRecord(e, side_));
}

// Layer k's tables on the side stream (one launch: ids checked on the host), then its event.
template <typename T>
void StepRows<T>::gather_layer(int64_t k, int64_t N) {
  if (path_ == RowPath::staged) return stage_layer(k);
  const int64_t n_tables = static_cast<int64_t>(layers_[static_cast<size_t>(k)].tables.size());
  const int64_t first = first_slot_[static_cast<size_t>(k)];
  std::vector<T*> outs;
  std::vector<RowSource> srcs;
  for (int64_t i = 0; i < n_tables; ++i) {
    outs.push_back(slot(k, i));
    srcs.push_back(sources_[static_cast<size_t>(first + i)]);
  }
  gather_rows_device_tables(outs.data(), srcs.data(), static_cast<int>(n_tables), rb_, N, RowErrors{}, side_);
  JTOK_CUDA_CHECK(cudaEventRecord(ready_[static_cast<size_t>(k)], side_));
}

// Staged layer k, queued on the side stream: the host function that gathers its tables' rows into
// their staging (after the previous request's copies of that staging: the stream is in order), a
// copy a table, the layer's event. Nothing here waits.
template <typename T>
void StepRows<T>::stage_layer(int64_t k) {
  StagedRequest& r = ring_[static_cast<size_t>(cur_)];
  const int64_t U = static_cast<int64_t>(r.unique.size());
  const int64_t n_tables = static_cast<int64_t>(layers_[static_cast<size_t>(k)].tables.size());
  JTOK_CUDA_CHECK(cudaLaunchHostFunc(
      side_, [](void* p) {
        const GatherCall* c = static_cast<const GatherCall*>(p);
        c->self->gather_staged(c->entry, c->k);
      },
      &r.calls[static_cast<size_t>(k)]));
  cudaEvent_t ready = ready_[static_cast<size_t>(k)];
  for (int64_t i = 0; i < n_tables; ++i)
    copy_staged_rows(slot(k, i), staging(k, i), U, d_, side_, i + 1 == n_tables ? ready : nullptr);
}

// On CUDA's callback thread: layer k's tables' rows of ring entry `entry`'s ids into their staging.
// No CUDA call; nothing thrown out: the first error is kept for check_error(), and from its layer
// on the request's rows are zeros, not gathered (its consumer still runs: zeros keep it finite).
template <typename T>
void StepRows<T>::gather_staged(int entry, int64_t k) noexcept {
  StagedRequest& r = ring_[static_cast<size_t>(entry)];
  const LayerTables& lt = layers_[static_cast<size_t>(k)];
  const int64_t U = static_cast<int64_t>(r.unique.size());
  bool failed = false;
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    failed = r.failed;
  }
  for (size_t i = 0; i < lt.tables.size() && !failed; ++i) {
    std::string why;
    try {
      gather_rows_to_staging(staging(k, static_cast<int64_t>(i)), *lt.tables[i], r.unique.data(), U);
      // A disk store's failed read gives zeros and is kept by the store (the CPU forward's
      // check_table_reads): here it fails the request.
      if (const DiskRows* disk = lt.tables[i]->disk_rows()) why = disk->take_error();
    } catch (const std::exception& e) {
      why = e.what();
      if (why.empty()) why = "an exception without a message";
    } catch (...) {
      why = "an exception that is not a std::exception";
    }
    if (!why.empty()) fail_request(entry, k, i, why);
    failed = !why.empty();
  }
  if (!failed) return;
  for (size_t i = 0; i < lt.tables.size(); ++i)
    std::memset(static_cast<void*>(staging(k, static_cast<int64_t>(i))), 0, static_cast<size_t>(U * d_) * sizeof(T));
}

template <typename T>
void StepRows<T>::fail_request(int entry, int64_t k, size_t i, const std::string& why) noexcept {
  try {
    std::lock_guard<std::mutex> lock(error_mu_);
    StagedRequest& r = ring_[static_cast<size_t>(entry)];
    if (r.failed) return;
    r.failed = true;
    r.error = "StepRows: the staged rows of layer " + std::to_string(layers_[static_cast<size_t>(k)].layer) +
              "'s table " + std::to_string(i) + ": " + why;
  } catch (...) {  // no memory for the message: the request still fails
  }
}

// Staged: the next ring entry, once its last request's host functions are done (normally long
// since), holds this request's host dedup; its error, if never checked, is dropped.
template <typename T>
void StepRows<T>::take_ring_entry(const int32_t* ids, int64_t N) {
  const int next = (cur_ + 1) % kRing;
  StagedRequest& r = ring_[static_cast<size_t>(next)];
  JTOK_CUDA_CHECK(cudaEventSynchronize(r.done));  // never recorded: returns at once
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    r.failed = false;
    r.error.clear();
  }
  // The host's dedup gives the same sorted unique ids as the device's (rows line up with rb_).
  const RowBatch host_rb = jtok::dedup_ids(ids, N, V_);
  r.unique.assign(host_rb.unique.begin(), host_rb.unique.end());
  last_unique_ = static_cast<int64_t>(r.unique.size());
  cur_ = next;
}

template <typename T>
void StepRows<T>::request(const int32_t* ids, int64_t N, cudaStream_t consumer) {
  JTOK_CHECK(N > 0 && N <= max_n_, "StepRows::request: ", N, " ids, at most ", max_n_);
  check_ids_in_range(ids, N, V_, "StepRows::request");
  const bool staged = path_ == RowPath::staged;
  if (staged) take_ring_entry(ids, N);
  upload_and_dedup(ids, N, consumer);
  try {
    for (int64_t k = 0; k < static_cast<int64_t>(layers_.size()); ++k) gather_layer(k, N);
  } catch (...) {  // staged: the host functions queued so far still read the entry; `done` follows them
    if (staged) cudaEventRecord(ring_[static_cast<size_t>(cur_)].done, side_);
    throw;
  }
  if (staged) JTOK_CUDA_CHECK(cudaEventRecord(ring_[static_cast<size_t>(cur_)].done, side_));
  mark(t_end_);
}

template <typename T>
void StepRows<T>::check_error() {
  if (path_ != RowPath::staged || cur_ < 0) return;
  StagedRequest& r = ring_[static_cast<size_t>(cur_)];
  JTOK_CUDA_CHECK(cudaEventSynchronize(r.done));
  std::string error;
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (!r.failed) return;
    r.failed = false;
    error = std::move(r.error);
    r.error.clear();
  }
  fail(error.empty() ? std::string("StepRows: a staged gather failed (no memory for its message)") : error);
}

// The side stream joins the consumer's queued work through consumer_mark_ (recorded on the consumer:
// in a capture, a fork of the graph), dedups the ids where they are and gathers every layer.
template <typename T>
void StepRows<T>::request_device(const int32_t* dev_ids, int64_t N, cudaStream_t consumer) {
  JTOK_CHECK(N > 0 && N <= max_n_, "StepRows::request_device: ", N, " ids, at most ", max_n_);
  JTOK_CHECK(path_ != RowPath::staged, "StepRows::request_device: the staged path gathers on the host");
  JTOK_CUDA_CHECK(cudaEventRecord(consumer_mark_, consumer));
  JTOK_CUDA_CHECK(cudaStreamWaitEvent(side_, consumer_mark_, 0));
  mark(t_begin_);
  dedup(dev_ids, N);
  for (int64_t k = 0; k < static_cast<int64_t>(layers_.size()); ++k) gather_layer(k, N);
  mark(t_end_);
}

template <typename T>
void StepRows<T>::enable_timing() {
  for (cudaEvent_t* e : {&t_begin_, &t_dedup_, &t_end_})
    if (!*e) JTOK_CUDA_CHECK(cudaEventCreate(e));
}

template <typename T>
typename StepRows<T>::Times StepRows<T>::last_times() const {
  Times t;
  if (!t_begin_) return t;
  float dedup = 0, gather = 0;
  JTOK_CUDA_CHECK(cudaEventSynchronize(t_end_));
  JTOK_CUDA_CHECK(cudaEventElapsedTime(&dedup, t_begin_, t_dedup_));
  JTOK_CUDA_CHECK(cudaEventElapsedTime(&gather, t_dedup_, t_end_));
  t.dedup_ms = dedup;
  t.gather_ms = gather;
  return t;
}

template <typename T>
int64_t StepRows<T>::last_unique() const {
  if (path_ == RowPath::staged) return last_unique_;
  int32_t U = 0;
  JTOK_CUDA_CHECK(cudaStreamSynchronize(side_));
  JTOK_CUDA_CHECK(cudaMemcpy(&U, rb_.num_unique, sizeof(U), cudaMemcpyDeviceToHost));
  return U;
}

template class StepRows<float>;
template class StepRows<__nv_bfloat16>;

}  // namespace jtok::cuda
