// TrainSteps: the trainer's set-up and step without a run directory (train/trainer.h).
#include "train/trainer.h"

#include "core/error.h"
#include "cuda/training.h"
#include "train/tables_cuda.h"
#include "train/trainer_run.h"

namespace jtok {

TrainSteps::TrainSteps(const Config& cfg, const TrainOptions& opt, BatchSource& data)
    : run_(std::make_unique<TrainRun>(cfg, opt, data, nullptr)) {
  TrainRun& r = *run_;
  r.watchdog.emplace("", 0.0);  // does nothing: a world of one, no timeout
  make_or_resume_model(r);
  prepare_step_buffers(r);
}

TrainSteps::~TrainSteps() = default;

void TrainSteps::compute_gradients() { sums_ = std::make_unique<StepSums>(forward_backward(*run_, steps_)); }

TrainSteps::Result TrainSteps::apply() {
  JTOK_CHECK(sums_ != nullptr, "TrainSteps::apply without compute_gradients");
  StepStats st;
  apply_or_skip(*run_, steps_, *sums_, st);  // not finite: throws (no step may be skipped here)
  ++steps_;
  const StepSums s = *sums_;
  sums_.reset();
  return {.loss = s.loss, .moe_aux = s.moe_aux, .jtokm_aux = s.jtokm_aux, .grad_norm = st.grad_norm, .lr = st.lr};
}

void TrainSteps::finish() {
  if (cuda::DeviceTrainer* dev = run_->tables->device()) {
    dev->finish();
    copy_replay_counts(*dev, run_->adam.tables);  // the final sync's rows, as the CPU's sync_tables counts them
  } else {
    sync_tables(run_->model, run_->adam);
  }
}

void TrainSteps::copy_back() {
  if (cuda::DeviceTrainer* dev = run_->tables->device()) dev->download(run_->model, nullptr);
}

bool TrainSteps::on_device() const { return run_->tables->device() != nullptr; }
cuda::DeviceTrainer* TrainSteps::device() const { return run_->tables->device(); }

Model& TrainSteps::model() { return run_->model; }
AdamWState& TrainSteps::optimizer_state() { return run_->adam; }

}  // namespace jtok
