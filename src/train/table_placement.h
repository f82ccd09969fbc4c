// Where a training run keeps the model's token tables, chosen once per run (choose_table_placement)
// and then called the same way by every step, whatever it is:
//   ram      every process holds the whole tables in the model (replicated under mpirun: their
//            gradients are summed over the ranks with the backbone's);
//   sharded  --embp: each rank holds the rows it owns (dist::ShardedTables), their moments and
//            their optimizer (ShardOptimizer); the model reaches rows through the shards;
//   disk     --tables disk: rows, moments and row steps in a training store on disk
//            (train/disk_tables.h), read ahead a step early, flushed and sealed around checkpoints;
//   gpu      --device cuda: the model, its tables and its optimizer state on one GPU
//            (train/tables_cuda.h); every step runs there, through device().
// A placement holds references to the run's model and optimizer state (TableRunParts), which
// exist, empty, before it is made; it fills them in at start_fresh or resume.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "dist/data_parallel.h"
#include "model/transformer.h"
#include "train/fault_injection.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace jtok {

struct JsonlLog;
namespace cuda {
class DeviceTrainer;
}

// What a placement works on: the run's parts, owned by the run (train/trainer_run.h).
struct TableRunParts {
  const Config& cfg;
  const TrainOptions& opt;
  const dist::BatchShare& share;
  const bool lead;  // rank 0: writes the run directory
  Model& model;
  AdamWState& adam;
  const FaultInjection& faults;
};

class TablePlacement {
 public:
  explicit TablePlacement(const TableRunParts& p) : p_(p) {}
  virtual ~TablePlacement() = default;
  TablePlacement(const TablePlacement&) = delete;
  TablePlacement& operator=(const TablePlacement&) = delete;

  // Set-up. make_model's `tables` option: whether the model allocates whole tables (a fresh run,
  // or init_from: --init-from's tables are loaded into them first).
  virtual bool model_allocates_tables(bool resuming, bool init_from) const = 0;
  // load_checkpoint's `tables`: whether the checkpoint's tables are read into the model on resume.
  virtual bool model_loads_tables() const = 0;
  // A fresh run (the model made, --init-from's weights loaded): the optimizer state made.
  virtual void start_fresh() = 0;
  // Resuming from checkpoint `ck`: refused, saying how to resume, when ck keeps its tables
  // elsewhere than this placement (checked before anything is loaded).
  virtual void check_resumable(const std::string& ck) const = 0;
  // A resumed run (the model and optimizer state loaded from checkpoint `ck` at step `step`).
  virtual void resume(const std::string& ck, int64_t step) = 0;
  // After the run log is open: what the forward reads rows through, and the start-up report.
  virtual void attach(Activations& acts, JsonlLog& log, int64_t start_step) = 0;

  // A step (`step` counts from 0): before its micro-batches (read-ahead, shard gradients cleared).
  virtual void begin_step(int64_t step, BatchSource& data) = 0;
  // Errors the gathers or write-backs kept (a failed read, a full disk) thrown, naming the file.
  virtual void check() {}
  // The model holds the rows (a fault injection can reach them), and under mpirun their gradients
  // are summed over the ranks with the backbone's.
  virtual bool rows_in_model() const = 0;
  // The sum of squares of table gradients the model does not hold (already summed over ranks).
  virtual double grad_sum_squares_elsewhere() { return 0; }
  // After optimizer_step (which updates the model's tables): the tables held elsewhere.
  virtual void step_tables(const StepStats&) {}
  // Under mpirun: the step's table exchange bytes per rank (a collective), added to dist_bytes.
  virtual void add_exchange_bytes(nlohmann::json&) {}

  // Reading whole tables (validation, samples): rows brought current. every_rank_reads: each
  // rank must join the reads (the rows are served by their owners).
  virtual void prepare_reads() = 0;
  virtual void after_reads() {}
  virtual bool every_rank_reads() const { return false; }
  virtual bool can_sample() const { return true; }
  // The step line's table traffic (log.jsonl) and the progress line's note; "" / nothing if none.
  virtual void report_step(nlohmann::json&) {}
  virtual std::string progress_note() const { return ""; }
  // --device cuda: the trainer that runs each step on the GPU (forward, backward, optimizer); null
  // where the steps run on the CPU.
  virtual cuda::DeviceTrainer* device() { return nullptr; }

  // The checkpoint of `step` with trainer state `state`: its directory, "" on ranks that wrote none.
  virtual std::string save_checkpoint(int64_t step, const nlohmann::json& state) = 0;

 protected:
  // save_checkpoint of the whole model by rank 0 (every placement's checkpoint files).
  std::string save_on_lead(int64_t step, const nlohmann::json& state);
  const TableRunParts p_;
};

// check_resumable of the placements that hold tables in memory: a checkpoint whose tables are in a
// training store (table_store.json) is refused, saying to resume with --tables disk.
void refuse_table_store_checkpoint(const std::string& ck);

// The placement --tables and --embp ask for (checked against the model and the ranks; a
// combination that cannot run is refused saying what to run instead). Under --embp a model
// without tables is placed in RAM.
std::unique_ptr<TablePlacement> choose_table_placement(const TableRunParts& p);

}  // namespace jtok
