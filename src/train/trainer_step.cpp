// One training step: the forward and backward of every micro-batch this rank runs, the sums over
// the ranks, and the non-finite policy in front of the optimizer.
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "cuda/training.h"
#include "dist/communicator.h"
#include "ops/bf16_weights.h"
#include "train/checkpoint.h"
#include "train/tables_cuda.h"
#include "train/trainer_run.h"

namespace jtok {

namespace {

constexpr int64_t kDigestMask = (int64_t{1} << 56) - 1;  // digests stay exact when summed over ranks

// Forward and backward of every micro-batch this rank runs; the gradients accumulate in the model.
void run_micro_batches(TrainRun& r, int64_t step, StepSums& s) {
  const TrainConfig& t = r.train_cfg;
  const dist::BatchShare& share = r.share;
  const int64_t B = t.micro_batch_size, T = t.seq_len;
  const double inv_acc = 1.0 / static_cast<double>(t.gradient_accumulation_steps);
  const double mb_weight = share.by_micro_batch ? inv_acc : inv_acc / static_cast<double>(share.ranks);
  const Bf16WeightScope bf16_weights;  // weights are fixed until the optimizer step: rounded to bf16 once
  for (int64_t mb = 0; mb < t.gradient_accumulation_steps; ++mb) {
    r.data.next(r.inputs.data(), r.targets.data(), B, T);  // every rank reads every micro-batch: one loader state
    inject_nan_table_row(r.faults, r.model, step + 1, r.inputs[0], !r.tables->rows_in_model());
    if (!share.runs(mb)) continue;
    // The last micro-batch this rank runs: its backward starts summing each layer's gradients.
    if (r.buckets && mb == r.last_micro_batch)
      r.acts.on_layer_grads_ready = [&r](int64_t layer) { r.buckets->layer_ready(r.model, layer); };
    else
      r.acts.on_layer_grads_ready = nullptr;
    const int32_t* xs = r.inputs.data() + share.row_lo * T;
    const int32_t* ys = r.targets.data() + share.row_lo * T;
    forward(r.model, r.acts, xs, share.row_hi - share.row_lo, T);
    if (mb == share.rank * share.by_micro_batch) s.hidden_std = hidden_state_std(r.acts);
    s.routing.add(r.acts);
    s.digest = (s.digest + dist::routing_digest(r.acts, mb, share.row_lo)) & kDigestMask;
    s.loss += backward(r.model, r.acts, xs, ys, share.grad_scale) * mb_weight;
    s.moe_aux += r.acts.moe_aux_loss * mb_weight;
    s.jtokm_aux += r.acts.jtokm_aux_loss * mb_weight;
  }
}

// --device cuda: each micro-batch's forward and backward on the GPU, the gradients accumulating there.
// The device measures the hidden-state spread (first micro-batch) and the routing counts too.
void run_micro_batches_on_device(TrainRun& r, cuda::DeviceTrainer& dev, int64_t step, StepSums& s) {
  const TrainConfig& t = r.train_cfg;
  const int64_t B = t.micro_batch_size, T = t.seq_len;
  const double inv_acc = 1.0 / static_cast<double>(t.gradient_accumulation_steps);
  for (int64_t mb = 0; mb < t.gradient_accumulation_steps; ++mb) {
    r.data.next(r.inputs.data(), r.targets.data(), B, T);
    inject_nan_table_row(r.faults, dev, step + 1, r.inputs[0], r.model.tables.empty());
    const cuda::MicroBatchLoss l =
        dev.forward_backward(r.inputs.data(), r.targets.data(), B, T, r.share.grad_scale, mb == 0);
    if (mb == 0) s.hidden_std = l.hidden_std;
    s.routing.add(l.jtokm_load, l.jtokm_weight_sum);
    s.loss += l.loss * inv_acc;
    s.moe_aux += l.moe_aux * inv_acc;
    s.jtokm_aux += l.jtokm_aux * inv_acc;
  }
}

// Under mpirun: gradients, losses and routing counts summed over the ranks, and the bytes each
// rank exchanged (backbone and the tables held elsewhere) in s.dist_bytes.
void sum_over_ranks(TrainRun& r, StepSums& s) {
  r.acts.on_layer_grads_ready = nullptr;
  const dist::ExchangeBytes xb = dist::sum_gradients(r.model, r.tables->rows_in_model(), r.buckets.get());
  RoutingStats& routing = s.routing;
  std::vector<double> sums = {s.loss, s.moe_aux, s.jtokm_aux};
  for (size_t k = 0; k < routing.load.size(); ++k) {
    sums.insert(sums.end(), routing.load[k].begin(), routing.load[k].end());
    sums.insert(sums.end(), routing.wsum[k].begin(), routing.wsum[k].end());
  }
  dist::allreduce_sum(sums.data(), static_cast<int64_t>(sums.size()));
  s.loss = sums[0], s.moe_aux = sums[1], s.jtokm_aux = sums[2];
  for (size_t k = 0, o = 3; k < routing.load.size(); ++k) {
    for (auto& v : routing.load[k]) v = sums[o++];
    for (auto& v : routing.wsum[k]) v = sums[o++];
  }
  s.dist_bytes = dist::gather_bytes_json(xb);
  r.tables->add_exchange_bytes(s.dist_bytes);
  int64_t dg[2] = {s.digest, 0};
  dist::allreduce_sum(dg, 2);
  s.digest = dg[0] & kDigestMask;
}

// Where a non-finite loss came from: the first dense weight or token-table row holding a NaN or an
// infinity ("" if none). Run only after a non-finite loss, so it costs nothing on the normal path.
std::string first_nonfinite_weight(const TrainRun& r) {
  if (r.tables->device()) return "the weights are on the GPU, not scanned";
  const Model& m = r.model;
  for (const auto& p : m.layout)
    for (int64_t i = 0; i < p.numel; ++i)
      if (!std::isfinite(m.params[static_cast<size_t>(p.offset + i)])) return p.name;
  for (size_t k = 0; k < m.tables.size(); ++k) {
    const TokenTable& t = m.tables[k];
    if (!t.f32_rows_in_memory()) continue;  // rows elsewhere are not scanned
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t c = 0; c < t.dim; ++c)
        if (!std::isfinite(t.row(r)[c])) return "table " + m.table_names[k] + " row " + std::to_string(r);
  }
  return "";
}

// The optimizer step, unless the loss or the gradient norm is not finite: then why ("" if applied).
std::string try_optimizer_step(TrainRun& r, double loss, StepStats& st) {
  if (!std::isfinite(loss)) {
    const std::string where = first_nonfinite_weight(r);
    return "the loss is " + std::to_string(loss) + "; the step was not applied (" +
           (where.empty() ? "every weight and table row is finite: an activation overflowed" : "first non-finite weight: " + where) + ")";
  }
  try {
    // The norm takes the table gradients the model does not hold (a collective with sharded
    // tables: every rank has the same loss here), and their owners update those rows.
    if (cuda::DeviceTrainer* dev = r.tables->device()) {
      st = device_optimizer_step(*dev, r.adam, r.train_cfg);  // refuses a non-finite norm first
      return "";
    }
    st = optimizer_step(r.model, r.adam, r.train_cfg, r.tables->grad_sum_squares_elsewhere());  // refuses a non-finite norm first
    r.tables->step_tables(st);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Stops the run at a step that must not be applied: logged, and nothing saved.
[[noreturn]] void fail_step(TrainRun& r, int64_t step, const std::string& why) {
  const auto newest = latest_checkpoint(r.opt.out_dir);
  const std::string msg = "step " + std::to_string(step) + ": " + why + "; nothing was saved (newest checkpoint: " +
                          (newest ? *newest : std::string("none")) + ")";
  r.log.write({{"type", "error"}, {"step", step}, {"message", msg}});
  fail(msg, "; lower learning_rate or check the data, then --resume");
}

}  // namespace

StepSums forward_backward(TrainRun& r, int64_t step) {
  r.tables->begin_step(step, r.data);  // read-ahead, gradients held elsewhere cleared
  cuda::DeviceTrainer* dev = r.tables->device();
  if (dev) dev->zero_grads();
  else zero_grads(r.model);
  r.watchdog->set_step(step + 1);
  StepSums s(*r.no_routing);
  if (dev) run_micro_batches_on_device(r, *dev, step, s);
  else run_micro_batches(r, step, s);
  r.tables->check();  // a read error in the gathers stops the run here, naming the file
  if (r.share.ranks > 1) sum_over_ranks(r, s);
  return s;
}

// The non-finite policy: a step whose loss or gradient is not finite is never applied. The run
// stops (fail_step), or with --skip-nonfinite-steps N the batch is dropped (up to N times) and
// false returned: the caller retries the step on the next batch.
bool apply_or_skip(TrainRun& r, int64_t step, const StepSums& s, StepStats& st) {
  if (cuda::DeviceTrainer* dev = r.tables->device()) inject_nan_grad(r.faults, *dev, step + 1);
  else inject_nan_grad(r.faults, r.model, step + 1);
  const std::string nonfinite = try_optimizer_step(r, s.loss, st);
  r.tables->check();  // a table write that failed (no space left) stops the run, naming the file
  if (nonfinite.empty()) return true;
  if (r.skipped_steps >= r.opt.skip_nonfinite_steps) fail_step(r, step + 1, nonfinite);
  ++r.skipped_steps;
  r.log.write({{"type", "skipped_step"}, {"step", step + 1}, {"reason", nonfinite}, {"skipped_total", r.skipped_steps}});
  std::printf("%sstep %lld skipped (%lld of %lld allowed): %s\n", r.tty ? "\n" : "", static_cast<long long>(step + 1),
              static_cast<long long>(r.skipped_steps), static_cast<long long>(r.opt.skip_nonfinite_steps), nonfinite.c_str());
  return false;
}

}  // namespace jtok
