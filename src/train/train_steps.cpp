// TrainSteps: the trainer's set-up and step without a run directory (train/trainer.h).
#include "train/trainer.h"
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

double TrainSteps::step() {
  const StepSums s = forward_backward(*run_, steps_);
  StepStats st;
  apply_or_skip(*run_, steps_, s, st);  // not finite: throws (no step may be skipped here)
  ++steps_;
  return s.loss;
}

Model& TrainSteps::model() { return run_->model; }
AdamWState& TrainSteps::optimizer_state() { return run_->adam; }

}  // namespace jtok
