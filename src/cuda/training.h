// A training run's model on the GPU (`jtok train --device cuda`): the device model (cuda/model.h) in
// fp32 or bf16, one micro-batch's activations and the device AdamW with the exact deferred table
// optimizer (cuda/model_optimizer.h), behind a plain C++ interface the trainer calls from g++ code
// (train/tables_cuda.cpp). The host's Model and AdamW arrays stay the run's checkpoint form: the
// device trainer is made from them (a fresh run, --init-from's weights or a resumed checkpoint) and
// writes them back before a checkpoint or a read on the host (a sample), so a checkpoint is the
// CPU engine's and resumes on either device.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/attention_rows.h"
#include "cuda/step_consts.h"
#include "model/transformer.h"

namespace jtok::cuda {

// The host's AdamW state by pointer (train/optimizer.h's AdamWState): the flat moments of the
// trainable tensors, each table's (Vp, d) moments, and the optimizer steps taken (every table row
// current at that step).
struct HostAdamWView {
  float* m = nullptr;
  float* v = nullptr;
  // Per layout entry: where its moments start in m / v, -1 for a frozen tensor (none kept); empty:
  // nothing frozen, the moments in m.params' layout.
  std::vector<int64_t> moment_offset;
  std::vector<float*> table_m, table_v;  // per table of Model::tables
  int64_t step = 0;
};

// One micro-batch's mean LM loss and aux losses (lambda / coef included, as the CPU's Activations).
struct MicroBatchLoss {
  double loss = 0, moe_aux = 0, jtokm_aux = 0;
  // Telemetry (train/telemetry.h) as the CPU's: the layers' output spread (when asked, else 0), and per
  // JTok-M layer in layer order, per table: the positions that chose it and their summed weights.
  double hidden_std = 0;
  std::vector<std::vector<double>> jtokm_load, jtokm_weight_sum;
};

class DeviceTrainer {
 public:
  virtual ~DeviceTrainer() = default;
  virtual void zero_grads() = 0;
  // inputs, targets (B,T) on the host: forward and backward; grad_scale * d(loss) accumulated.
  // hidden_std: the forward's hidden-state spread measured too.
  virtual MicroBatchLoss forward_backward(const int32_t* inputs, const int32_t* targets, int64_t B, int64_t T,
                                          float grad_scale, bool hidden_std) = 0;
  // The mean cross-entropy of one batch, no gradient (validation).
  virtual double eval_loss(const int32_t* inputs, const int32_t* targets, int64_t B, int64_t T) = 0;
  // Clips at max_grad_norm (<= 0: never) and steps every parameter and table; returns the gradient
  // norm once the step's work is done. A non-finite norm throws before any weight or moment moves.
  virtual double optimizer_step(const StepConsts& c, float max_grad_norm) = 0;
  // Every table row brought current (the deferred updates owed) and the queued work finished.
  virtual void finish() = 0;
  // Every table row brought current, then the fp32 weights and tables into host (whose layout they
  // have) and, unless adam is null, the moments into adam's arrays (the host counts the steps itself).
  virtual void download(Model& host, const HostAdamWView* adam) = 0;
  // Fault injection (train/fault_injection.h): a NaN in the middle of the flat gradients, or in row
  // `row` of table `table`.
  virtual void poison_gradient() = 0;
  virtual void poison_table_row(int64_t table, int64_t row) = 0;
  // "bf16 on NVIDIA H200: 1.52 GiB of weights, tables and moments" (the start-up report).
  virtual std::string describe() const = 0;
  // bf16: the attention kernels' query rows a warp, timed and chosen at the first forward (fwd 0
  // before it; fp32 and the loopback trainer: never chosen).
  virtual AttentionRows attention_rows() const { return {}; }
  // The steps' phases timed on the device from now on (cuda/phase_profile.h), or no longer; and the
  // milliseconds a step of each phase over the optimizer steps since (empty when not profiling).
  virtual void set_profiling(bool on) { (void)on; }
  virtual std::vector<std::pair<std::string, double>> profile_ms() const { return {}; }
  // The tables' catch-up work since the trainer was made, as last read back (each optimizer step's
  // and finish's read): rows brought current by a replay, those with non-zero moments, the steps
  // those replayed, and rows the steps updated with a gradient (train/table_optimizer.h's
  // TableMoments counters). False: not counted here.
  struct ReplayCounts {
    int64_t rows = 0, warm_rows = 0, warm_steps = 0, stepped_rows = 0;
  };
  virtual bool replay_counts(ReplayCounts& out) const {
    (void)out;
    return false;
  }
};

// How the device trainer runs the token tables (train config fields table_optimizer, table_dedup,
// table_streams).
struct DeviceTableOptions {
  bool dense = true;   // "dense" table AdamW (deferred, exact), else "sparse"
  bool eager = false;  // dense's rows all brought current after every step (the naive cost, for benchmarks)
  // false: JTok's and JTok-M's rows gathered and scattered a token position at a time (cuda/model.h's
  // DeviceActs::table_dedup: the naive cost; fp32 atomics, not bitwise reproducible)
  bool dedup = true;
  bool streams = false;  // the table AdamW and row syncs on side streams (cuda/table_streams.h): the same bits
};

// The device trainer of host's weights and tables with adam's moments (a resumed run's; zeros for a
// fresh one), every table row current at adam.step. bf16: the forward reads bf16 copies of the fp32
// masters (else fp32 throughout, the checking instantiation). Refuses what the GPU model does not
// run, by name; in a build without CUDA, says so.
std::unique_ptr<DeviceTrainer> make_device_trainer(const Model& host, const HostAdamWView& adam, bool bf16,
                                                   const DeviceTableOptions& tables = {});

}  // namespace jtok::cuda
