// The one table optimizer (train/table_optimizer.h) over this rank's shards of an embedding-
// parallel run (dist::ShardedTables): the AdamW moments of the owned rows live here, beside the
// optimizer that updates them, and each shard's owner brings a row current through it before it
// answers a request for the row. Checkpoints: the owned rows with their moments written in place
// (owned_rows), or everything gathered to rank 0 (gather_to_root).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dist/sharded_tables.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"
#include "train/table_optimizer.h"

namespace jtok {

class ShardOptimizer {
 public:
  // Zero moments for every owned row at step `step`, or (checkpoint_dir: a resume) the owned rows'
  // moments read from the checkpoint's optimizer.safetensors. st loses its (whole) table moments.
  ShardOptimizer(dist::ShardedTables& tables, Model& m, AdamWState& st, const std::string* checkpoint_dir);
  ShardOptimizer(const ShardOptimizer&) = delete;
  ShardOptimizer& operator=(const ShardOptimizer&) = delete;

  // The table step with the step optimizer_step just took (the shards' gradients final first).
  void step(const TrainConfig& t, const StepStats& st, int64_t step);
  void sync_all();  // every owned row current
  // This rank's rows of every model table with their moments, current (save_checkpoint_sharded).
  // Valid until the next step.
  std::vector<TableRows> owned_rows();
  // Rank 0 gets the whole tables and moments into m and st (a collective); release() takes them out.
  void gather_to_root(Model& m, AdamWState& st);
  void release(Model& m, AdamWState& st);
  int64_t moment_bytes() const;

 private:
  dist::ShardedTables& tables_;
  std::vector<TableMoments> moments_;  // per shard, per table of it
  std::vector<TableOptimizer> opt_;    // per shard: views over its tables, gradients and moments
};

}  // namespace jtok
