// The training loop's state and its named steps, shared by src/train/trainer*.cpp only: `train()`
// (trainer.cpp) is the table of contents; set-up and shutdown live beside it, one step and the
// non-finite policy in trainer_step.cpp, the periodic work (progress, validation, samples,
// checkpoints) in trainer_periodic.cpp.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dist/data_parallel.h"
#include "dist/watchdog.h"
#include "model/transformer.h"
#include "train/fault_injection.h"
#include "train/jsonl_log.h"
#include "train/optimizer.h"
#include "train/run_dir.h"
#include "train/table_placement.h"
#include "train/telemetry.h"
#include "train/trainer.h"

namespace jtok {

// Everything a run holds from set-up to shutdown. Under mpirun (dist/data_parallel.h) every rank
// trains its share of each step; rank 0 alone (`lead`) owns the run directory (lock, log,
// checkpoints), validation and samples. Members are made in the order below and destroyed in
// reverse: the watchdog outlives every collective, the directory lock is released last.
struct TrainRun {
  TrainRun(const Config& cfg, const TrainOptions& opt, BatchSource& data, ValSource* val);
  const Config& cfg;
  const TrainConfig& train_cfg;
  const TrainOptions& opt;
  BatchSource& data;
  ValSource* val;
  const bool lead;
  const dist::BatchShare share;
  std::optional<RunDirLock> lock;
  std::optional<dist::Watchdog> watchdog;
  std::string log_path;
  std::optional<std::string> resumed_from;  // the checkpoint resumed from
  Model model;
  AdamWState adam;
  FaultInjection faults;
  std::unique_ptr<TablePlacement> tables;  // where the token tables live, chosen once
  std::mt19937_64 sample_rng;
  int64_t start_step = 0;
  std::string run_id;
  int64_t skipped_steps = 0;
  JsonlLog log;  // other ranks: never opened, writes go nowhere
  bool tty = false;
  std::vector<int32_t> inputs, targets;  // one micro-batch's, (B,T) each
  Activations acts;
  std::unique_ptr<dist::GradBuckets> buckets;  // backbone gradients summed during the backward
  int64_t last_micro_batch = -1;               // the last micro-batch this rank runs in a step
  std::optional<RoutingStats> no_routing;      // zero counts for the JTok-M layers, copied each step
  TrainResult result;
  double elapsed_train = 0;  // seconds over the timed steps (all but the first)
  int64_t timed_steps = 0;
};

// One step's sums over its micro-batches (and over the ranks): the LM loss and the aux losses
// (MoE, JTok-M) apart (the gradient is of their sum), telemetry, and the bytes exchanged.
struct StepSums {
  explicit StepSums(const RoutingStats& zero) : routing(zero) {}
  double loss = 0, moe_aux = 0, jtokm_aux = 0, hidden_std = 0;
  RoutingStats routing;
  int64_t digest = 0;  // of the step's routing choices (MoE, JTok-M), for comparing runs
  nlohmann::json dist_bytes;
};

// Set-up and shutdown (trainer.cpp).
void claim_run_directory(TrainRun& r);
void make_or_resume_model(TrainRun& r);
void open_run_log(TrainRun& r);
void prepare_step_buffers(TrainRun& r);
bool stop_requested_on_any_rank();
void finish_run(TrainRun& r);

// One step and the non-finite policy (trainer_step.cpp). `step` counts from 0.
StepSums forward_backward(TrainRun& r, int64_t step);
bool apply_or_skip(TrainRun& r, int64_t step, const StepSums& s, StepStats& st);

// Periodic work after an applied step (trainer_periodic.cpp). `done` = steps applied.
void log_step(TrainRun& r, int64_t done, const StepSums& s, const StepStats& st, double dt);
void maybe_validate(TrainRun& r, int64_t done);
void maybe_sample(TrainRun& r, int64_t done);
void save_checkpoint_at(TrainRun& r, int64_t step);

}  // namespace jtok
