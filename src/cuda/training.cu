// The device trainer (src/cuda/training.h): cuda/model.h's model, activations and optimizer behind
// the plain interface, with the moments and row steps of a host checkpoint uploaded and written back.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

#include "cuda/device.h"
#include "cuda/model.h"
#include "cuda/model_kernels.h"
#include "cuda/model_optimizer.h"
#include "cuda/training.h"

namespace jtok::cuda {

namespace {

// f(device offset, host offset, n) for each tensor with moments: the device keeps every tensor's in
// the params' layout, the host only the trainable ones' (adam.moment_offset; empty: all, in place).
template <typename E, typename F>
void for_each_moment_block(const DeviceModel<E>& dm, const HostAdamWView& adam, F&& f) {
  if (adam.moment_offset.empty()) {
    f(0, 0, dm.n_params);
    return;
  }
  JTOK_CHECK(adam.moment_offset.size() == dm.layout.size(), "cuda trainer: moment offsets for ",
             adam.moment_offset.size(), " tensors, the model has ", dm.layout.size());
  for (size_t i = 0; i < dm.layout.size(); ++i)
    if (adam.moment_offset[i] >= 0) f(dm.layout[i].offset, adam.moment_offset[i], dm.layout[i].numel);
}

// The host moments (every row current at adam.step) into the device optimizer state.
template <typename E>
void upload_moments(const DeviceModel<E>& dm, DeviceAdamW& st, const HostAdamWView& adam) {
  JTOK_CHECK(adam.m && adam.v, "cuda trainer: the host optimizer state has no flat moments");
  JTOK_CHECK(static_cast<int64_t>(adam.table_m.size()) == dm.n_tables &&
                 static_cast<int64_t>(adam.table_v.size()) == dm.n_tables,
             "cuda trainer: the host optimizer state has moments for ", adam.table_m.size(), " tables, the model ",
             dm.n_tables);
  for_each_moment_block(dm, adam, [&](int64_t device_at, int64_t host_at, int64_t n) {
    copy_to_device(st.m.get() + device_at, adam.m + host_at, n);
    copy_to_device(st.v.get() + device_at, adam.v + host_at, n);
  });
  for (int64_t k = 0; k < dm.n_tables; ++k) {
    copy_to_device(st.table_m.get() + k * dm.table_numel, adam.table_m[static_cast<size_t>(k)], dm.table_numel);
    copy_to_device(st.table_v.get() + k * dm.table_numel, adam.table_v[static_cast<size_t>(k)], dm.table_numel);
  }
  JTOK_CHECK(adam.step >= 0 && adam.step <= std::numeric_limits<int32_t>::max(), "cuda trainer: step ", adam.step);
  for (DeviceArray<int32_t>* rows : {&st.row_step, &st.embed_row_step}) {
    const std::vector<int32_t> steps(static_cast<size_t>(rows->size()), static_cast<int32_t>(adam.step));
    copy_to_device(rows->get(), steps.data(), rows->size());
  }
  st.step = adam.step;
  st.kept.reset(adam.step);  // every row current: nothing kept to replay
  st.embed_kept.reset(adam.step);
}

template <typename E>
class Trainer final : public DeviceTrainer {
 public:
  Trainer(const Model& host, const HostAdamWView& adam, const DeviceTableOptions& t)
      : dm_(host), opt_(dm_, t.dense), eager_tables_(t.eager), device_(device_info().name) {
    upload_moments(dm_, opt_, adam);
    if (t.streams) use_table_streams(dm_, opt_);
    acts_.row_sync = table_row_sync(dm_, opt_);
    acts_.row_wait = table_row_wait(dm_, opt_);
    acts_.embed_sync = embedding_row_sync(dm_, opt_);
    acts_.table_dedup = t.dedup;
    opt_.zero_table_grad_rows = !t.dedup;
    acts_.max_chunk_rows = lm_head_chunk_rows(dm_.cfg.padded_vocab(), sizeof(E));
  }

  void zero_grads() override { cuda::zero_grads(dm_); }

  MicroBatchLoss forward_backward(const int32_t* inputs, const int32_t* targets, int64_t B, int64_t T,
                                  float grad_scale, bool hidden_std) override {
    stage(inputs, targets, B * T);
    forward(dm_, acts_, staged_ids_.get(), B, T);
    queue_forward_stats(dm_, acts_, hidden_std);  // read after the backward's sync: none of their own
    join_table_streams(dm_, opt_);                // the backward writes the tables' gradients and flags
    MicroBatchLoss r;
    r.loss = backward(dm_, acts_, staged_targets_.get(), grad_scale);
    ForwardStats stats = read_forward_stats(dm_, acts_, true);  // the loss's read waited for the stream
    r.hidden_std = stats.hidden_std;
    r.moe_aux = stats.moe_aux;
    r.jtokm_aux = stats.routing.aux;
    r.jtokm_load = std::move(stats.routing.load);
    r.jtokm_weight_sum = std::move(stats.routing.weight_sum);
    return r;
  }

  double eval_loss(const int32_t* inputs, const int32_t* targets, int64_t B, int64_t T) override {
    stage(inputs, targets, B * T);
    forward(dm_, acts_, staged_ids_.get(), B, T);
    return forward_loss(dm_, acts_, staged_targets_.get());
  }

  double optimizer_step(const StepConsts& c, float max_grad_norm) override {
    const double norm = cuda::optimizer_step(dm_, opt_, c, max_grad_norm);
    if (eager_tables_) {
      sync_tables(dm_, opt_, true);  // every table row now: the naive pass a step
      mark_phase(dm_.profile, "eager table sync", dm_.stream);
    }
    JTOK_CUDA_CHECK(cudaStreamSynchronize(dm_.stream));  // a step ends with its work done: honest step times
    if (profile_) profile_->end_step();
    return norm;
  }

  void set_profiling(bool on) override {
    profile_ = on ? std::make_unique<PhaseProfile>() : nullptr;
    dm_.profile = profile_.get();
  }
  std::vector<std::pair<std::string, double>> profile_ms() const override {
    return profile_ ? profile_->mean_ms() : std::vector<std::pair<std::string, double>>{};
  }

  bool replay_counts(ReplayCounts& out) const override {
    out = {static_cast<int64_t>(opt_.counts[0]), static_cast<int64_t>(opt_.counts[1]),
           static_cast<int64_t>(opt_.counts[2]), static_cast<int64_t>(opt_.counts[3])};
    return true;
  }

  void finish() override {
    sync_tables(dm_, opt_);
    JTOK_CUDA_CHECK(cudaStreamSynchronize(dm_.stream));
  }
  void download(Model& host, const HostAdamWView* adam) override;
  void poison_gradient() override;
  // The batch into pinned host buffers, so its copies to the device are DMA transfers queued on the
  // stream (from pageable memory the runtime stages them itself, synchronously). The previous batch's
  // copies are done: its backward read its loss back.
  void stage(const int32_t* inputs, const int32_t* targets, int64_t n) {
    if (staged_ids_.size() < n) staged_ids_ = PinnedArray<int32_t>(n), staged_targets_ = PinnedArray<int32_t>(n);
    std::memcpy(staged_ids_.get(), inputs, static_cast<size_t>(n) * sizeof(int32_t));
    std::memcpy(staged_targets_.get(), targets, static_cast<size_t>(n) * sizeof(int32_t));
  }
  void poison_table_row(int64_t table, int64_t row) override;
  std::string describe() const override;
  AttentionRows attention_rows() const override { return dm_.attn_rows; }

 private:
  DeviceModel<E> dm_;
  DeviceAdamW opt_;
  DeviceActs<E> acts_;
  PinnedArray<int32_t> staged_ids_, staged_targets_;  // (B*T) each
  std::unique_ptr<PhaseProfile> profile_;  // while profiling (set_profiling)
  bool eager_tables_ = false;
  std::string device_;
};

template <typename E>
void Trainer<E>::download(Model& host, const HostAdamWView* adam) {
  sync_tables(dm_, opt_);  // every row current before whole tables are read
  JTOK_CHECK(static_cast<int64_t>(host.params.size()) == dm_.n_params, "cuda trainer: the host model has ",
             host.params.size(), " parameters, the device ", dm_.n_params);
  copy_to_host(host.params.data(), dm_.master.get(), dm_.n_params, dm_.stream);
  for (int64_t k = 0; k < dm_.n_tables; ++k)
    copy_to_host(host.tables[static_cast<size_t>(k)].mutable_data(), dm_.tables.get() + k * dm_.table_numel,
                 dm_.table_numel, dm_.stream);
  if (!adam) return;
  for_each_moment_block(dm_, *adam, [&](int64_t device_at, int64_t host_at, int64_t n) {
    copy_to_host(adam->m + host_at, opt_.m.get() + device_at, n, dm_.stream);
    copy_to_host(adam->v + host_at, opt_.v.get() + device_at, n, dm_.stream);
  });
  for (int64_t k = 0; k < dm_.n_tables; ++k) {
    copy_to_host(adam->table_m[static_cast<size_t>(k)], opt_.table_m.get() + k * dm_.table_numel, dm_.table_numel,
                 dm_.stream);
    copy_to_host(adam->table_v[static_cast<size_t>(k)], opt_.table_v.get() + k * dm_.table_numel, dm_.table_numel,
                 dm_.stream);
  }
}

// One NaN written at `at` of the fp32 array and, for a bf16 model, of its forward copy.
template <typename E>
void write_nan(float* at, E* copy_at, cudaStream_t s) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  JTOK_CUDA_CHECK(cudaStreamSynchronize(s));
  copy_to_device(at, &nan, 1);
  if (copy_at) convert_from_f32(copy_at, at, 1, s);
}

// The middle of the flat gradients, moved to the nearest trainable element: a frozen backbone's
// gradients are never written (their pointers are null in dm_.g), as on the CPU, so a NaN written
// there would stand for no gradient the backward makes.
template <typename E>
void Trainer<E>::poison_gradient() {
  const int64_t mid = dm_.n_params / 2;
  int64_t at = -1;
  for (size_t i = 0; i < dm_.layout.size(); ++i) {
    const ParamInfo& p = dm_.layout[i];
    if (!dm_.trainable[i] || p.numel == 0) continue;
    const int64_t in = std::clamp(mid, p.offset, p.offset + p.numel - 1);
    if (at < 0 || std::llabs(in - mid) < std::llabs(at - mid)) at = in;
  }
  if (at < 0) at = mid;
  write_nan<float>(dm_.grads.get() + at, nullptr, dm_.stream);
  const int64_t in_embed = at - dm_.embed_offset(), d = dm_.cfg.hidden_size;
  if (dm_.embed_rows_on() && in_embed >= 0 && in_embed < dm_.embed_flags.size() * d) {  // a row-sparse one's row:
    dm_.embed_flags.flag(in_embed / d);  // as a backward's own gradient would be, so zero_grads clears it
  }
}

template <typename E>
void Trainer<E>::poison_table_row(int64_t table, int64_t row) {
  JTOK_CHECK(table >= 0 && table < dm_.n_tables && row >= 0 && row < dm_.cfg.padded_vocab(),
             "cuda trainer: no row ", row, " of table ", table);
  join_table_streams(dm_, opt_);
  const int64_t at = table * dm_.table_numel + row * dm_.cfg.hidden_size;
  E* copy_at = nullptr;
  if constexpr (!std::is_same_v<E, float>) copy_at = dm_.table_copy.get() + at;
  write_nan(dm_.tables.get() + at, copy_at, dm_.stream);
}

template <typename E>
std::string Trainer<E>::describe() const {
  size_t bytes = dm_.master.bytes() + dm_.copy.bytes() + dm_.grads.bytes() + dm_.tables.bytes() +
                 dm_.table_copy.bytes() + dm_.table_grads.bytes() + opt_.m.bytes() + opt_.v.bytes() +
                 opt_.table_m.bytes() + opt_.table_v.bytes() + opt_.row_step.bytes() + dm_.table_flags.bytes() +
                 opt_.embed_row_step.bytes() + dm_.embed_flags.bytes();
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s on %s: %.2f GiB of weights, tables, gradients and moments",
                std::is_same_v<E, float> ? "fp32" : "bf16", device_.c_str(),
                static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  std::string what = buf;
  if (opt_.defer_embedding) what += "; the token embedding stepped by its rows (exact deferred AdamW)";
  return what;
}

}  // namespace

std::unique_ptr<DeviceTrainer> make_device_trainer(const Model& host, const HostAdamWView& adam, bool bf16,
                                                   const DeviceTableOptions& tables) {
  if (bf16) return std::make_unique<Trainer<__nv_bfloat16>>(host, adam, tables);
  return std::make_unique<Trainer<float>>(host, adam, tables);
}

}  // namespace jtok::cuda
