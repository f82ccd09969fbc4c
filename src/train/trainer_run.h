// The training loop's state and its named steps, shared by src/train/trainer*.cpp only: `train()`
// (trainer.cpp) is the table of contents; set-up and shutdown live beside it, one step and the
// non-finite policy in trainer_step.cpp, the periodic work (progress, validation, samples,
// checkpoints) in trainer_periodic.cpp.
#pragma once
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/data_parallel.h"
#include "dist/sharded_tables.h"
#include "dist/watchdog.h"
#include "model/transformer.h"
#include "train/disk_tables.h"
#include "train/fault_injection.h"
#include "train/optimizer.h"
#include "train/run_dir.h"
#include "train/shard_optimizer.h"
#include "train/telemetry.h"
#include "train/trainer.h"

namespace jtok {

// Appends one JSON object per line; flushed after each line so a kill loses at most the last.
struct JsonlLog {
  std::ofstream out;
  // Text that is not valid UTF-8 (a sample cut inside a byte-level token's character) is written
  // with U+FFFD in place of the bad bytes: a log line never ends the run.
  void write(const nlohmann::json& j) {
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    out.flush();
  }
};

// Everything a run holds from set-up to shutdown. Under mpirun (dist/data_parallel.h) every rank
// trains its share of each step; rank 0 alone (`lead`) owns the run directory (lock, log,
// checkpoints), validation and samples. Members are made in the order below and destroyed in
// reverse: the watchdog outlives every collective, the directory lock is released last.
struct TrainRun {
  TrainRun(const Config& cfg, const TrainOptions& opt, BatchSource& data, ValSource* val);
  const Config& cfg;
  const TrainConfig& t;
  const TrainOptions& opt;
  BatchSource& data;
  ValSource* val;
  const bool lead;
  const dist::BatchShare share;
  std::optional<RunDirLock> lock;
  std::optional<dist::Watchdog> watchdog;
  std::string log_path;
  std::optional<std::string> ck;  // the checkpoint resumed from
  bool embp_on = false;           // --embp with a token table: each rank holds its rows only
  bool shard_init = false;        // embp_on on a fresh run: each rank initialises its own rows
  Model model;
  AdamWState adam;
  std::mt19937_64 sample_rng;
  int64_t start_step = 0;
  std::string run_id;
  FaultInjection faults;
  int64_t skipped_steps = 0;
  JsonlLog log;  // other ranks: never opened, writes go nowhere
  std::unique_ptr<dist::ShardedTables> embp;
  std::unique_ptr<ShardOptimizer> embp_opt;  // the owned rows' moments and their table optimizer
  std::shared_ptr<TrainTableStore> store;     // --tables disk: the model's tables' store
  TrainTableStore::Stats store_seen;          // its counters at the last step line
  TrainTableStore::Stats store_step;          // the last step line's traffic (counters' differences)
  bool tty = false;
  std::vector<int32_t> x, y;  // one micro-batch's inputs and targets, (B,T) each
  Activations acts;
  std::unique_ptr<dist::GradBuckets> buckets;  // backbone gradients summed during the backward
  int64_t last_mb = -1;                        // the last micro-batch this rank runs in a step
  std::optional<RoutingStats> no_routing;      // zero counts for the JTok-M layers, copied each step
  TrainResult res;
  double elapsed_train = 0;  // seconds over the timed steps (all but the first)
  int64_t timed_steps = 0;
};

// One step's sums over its micro-batches (and over the ranks): the LM loss and the aux losses
// (MoE, JTok-M) apart (the gradient is of their sum), telemetry, and the bytes exchanged.
struct StepSums {
  explicit StepSums(const RoutingStats& zero) : routing(zero) {}
  double loss = 0, aux = 0, jaux = 0, hstd = 0;
  RoutingStats routing;
  int64_t digest = 0;  // of the step's routing choices (MoE, JTok-M), for comparing runs
  nlohmann::json dist_bytes;
};

// Set-up and shutdown (trainer.cpp).
void claim_run_directory(TrainRun& r);
void make_or_resume_model(TrainRun& r);
void open_run_log(TrainRun& r);
void shard_tables(TrainRun& r);
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

// This rank's pair (a, b) next to every other rank's, in rank order (a collective).
void gather_pairs(const dist::BatchShare& share, int64_t a, int64_t b, std::vector<int64_t>& as, std::vector<int64_t>& bs);

}  // namespace jtok
