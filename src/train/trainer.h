// The training loop behind `jtok train`: steps, logging, validation, samples, checkpoints, resume.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "store/table_io.h"
#include "train/config.h"

namespace jtok {

namespace cuda {
class DeviceTrainer;  // cuda/training.h
}

struct Model;

// Where training batches come from; its state is saved in checkpoints for exact resume.
struct BatchSource {
  std::function<void(int32_t* inputs, int32_t* targets, int64_t B, int64_t T)> next;  // (B,T) each
  // Optional: the inputs of the next n batches next() will give, (n,B,T), without consuming them
  // (--tables disk reads their rows ahead).
  std::function<void(int64_t n, int32_t* inputs, int64_t B, int64_t T)> peek;
  std::function<nlohmann::json()> state;
  std::function<void(const nlohmann::json&)> restore;
};
// A fixed validation set: reset() then next() eval_batches times gives the same batches always.
// batches: how many distinct ones it holds (eval_batches 0 reads each once; next() wraps after them).
struct ValSource {
  int64_t batches = 0;
  std::function<void()> reset;
  std::function<void(int32_t* inputs, int32_t* targets, int64_t B, int64_t T)> next;
};

struct TrainOptions {
  std::string out_dir;
  // "cpu", or "cuda": every step on one GPU (train/tables_cuda.h), the model's weights, tables and
  // optimizer state there; checkpoints, logs and resume as on the CPU. "loopback" (tests): that
  // path with the CPU engine as the device (train/loopback_trainer.h).
  std::string device = "cpu";
  bool resume = false;
  // Embedding parallelism under mpirun (dist/sharded_tables.h): "off" (tables replicated on every
  // rank), "premix", "premix-dedup" or "naive" (JTok-M's exchange); embp_owner "mod" (id mod P) or
  // "contiguous".
  std::string embp = "off", embp_owner = "mod";
  // Under mpirun: a rank blocked this long in one MPI call ends the job naming the ranks that stopped
  // (dist/watchdog.h); <= 0: never.
  double dist_timeout_s = 600;
  // Under mpirun: sum the backbone gradients in per-layer buckets started during the backward
  // (dist::GradBuckets, overlapped), or (false) in one blocking allreduce after it. Same bits.
  bool grad_overlap = true;
  // With embp: JTok-M's exchanges posted after each layer's router and completed at its write-back,
  // its backward's likewise, and the table gradients pushed without waiting (overlapped), or (false)
  // every table exchange a blocking MPI_Alltoallv where the model asks for it. Same bits.
  bool embp_overlap = true;
  bool overwrite = false;  // a fresh run may delete an old run's checkpoints and log in out_dir (run_dir.h)
  // Token tables: "ram", or "disk": rows, moments and row steps in a training store at table_store
  // (train/disk_tables.h) with a DRAM cache of table_cache_mb; made from the initial tables, reopened
  // (rolled back to the checkpoint) on resume.
  std::string tables = "ram", table_store;
  int64_t table_cache_mb = 256;
  // --tables disk: the next step's rows read ahead by this many I/O threads while a step computes
  // (0: no read-ahead; the gathers read what they miss).
  int table_io_threads = 4;
  TableIo table_io = TableIo::automatic;  // --tables disk: how units are read (store/table_io.h)
  // A fresh run's weights from this checkpoint directory (train/init_from.h; the config already
  // checked and adjusted by plan_init_from); ignored when --resume finds a checkpoint of the run.
  std::string init_from;
  // A fresh run's weights set by the caller before the optimizer state and the tables' placement
  // start (`jtok parity`'s --weights); a whole-table placement only.
  std::function<void(Model&)> init_weights;
  int64_t skip_nonfinite_steps = 0;  // drop up to this many batches whose loss or gradient is not finite
  std::string command_line;
  // Text for a periodic sample: given a generate function (max_new_tokens -> text); optional.
  std::function<std::string(const std::function<std::vector<int32_t>(const std::vector<int32_t>&, int64_t)>&)> sample;
  nlohmann::json extra_report;   // printed and logged at start (parameter and FLOPs accounting)
  double peak_gflops = 0;        // for MFU; 0 = not shown
  double flops_per_token = 0;    // training FLOPs per token, for MFU
  // Benches (bench/embp_throughput.sh): no checkpoint and no validation at all, so a short run
  // measures steps only and leaves nothing to resume.
  bool no_checkpoints = false;
  // With no_checkpoints, validate anyway (every eval_interval steps and after the last): a study that
  // compares held-out losses and keeps no checkpoint (bench/gpu_study.sh).
  bool validate = false;
};

struct TrainResult {
  int64_t steps_done = 0;
  double last_loss = 0, last_val_loss = -1;
  bool interrupted = false;
};

TrainResult train(const Config& cfg, const TrainOptions& opt, BatchSource& data, ValSource* val);

struct AdamWState;
struct TrainRun;
struct StepSums;

// A run's steps without its run directory, log, validation or checkpoints (`jtok bench-train`):
// the model, its tables and optimizer state made as a fresh `train` makes them (opt.tables and
// opt.embp place the tables), and each step the trainer's own (train/trainer_step.cpp).
class TrainSteps {
 public:
  TrainSteps(const Config& cfg, const TrainOptions& opt, BatchSource& data);
  ~TrainSteps();
  TrainSteps(const TrainSteps&) = delete;
  TrainSteps& operator=(const TrainSteps&) = delete;
  // The figures of one step: its loss and aux losses (means over the micro-batches), and the
  // optimizer's gradient norm and learning rate.
  struct Result {
    double loss = 0, moe_aux = 0, jtokm_aux = 0, grad_norm = 0, lr = 0;
  };
  // The next step: forward and backward of every micro-batch data gives (the gradients then in the
  // model), then the optimizer; a step whose loss or gradient is not finite throws.
  void compute_gradients();
  Result apply();
  Result step() {
    compute_gradients();
    return apply();
  }
  // Every table row brought current (the deferred updates the steps owe) and, on a GPU, the queued
  // work finished.
  void finish();
  // On a GPU (TrainOptions::device): its weights and tables copied into model(), which otherwise
  // holds the weights the run started from. Nothing to do on the CPU.
  void copy_back();
  bool on_device() const;
  cuda::DeviceTrainer* device() const;  // the GPU's trainer (null on the CPU)
  Model& model();
  AdamWState& optimizer_state();

 private:
  std::unique_ptr<TrainRun> run_;
  int64_t steps_ = 0;
  std::unique_ptr<StepSums> sums_;  // compute_gradients' sums, until apply
};

// Installs a SIGINT/SIGTERM handler that asks the loop to stop after the current step.
void install_stop_handler();

}  // namespace jtok
