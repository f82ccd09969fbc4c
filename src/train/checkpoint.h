// Training checkpoints: one directory per step under the run directory,
//   <run>/checkpoints/step_00001200/{model.safetensors, optimizer.safetensors, trainer_state.json,
//                                     config.json, COMPLETE}
// A run whose tables are in a training table store (--tables disk, train/disk_tables.h) has no
// tables in either safetensors file and a table_store.json in their place (the store is flushed by
// the trainer before the checkpoint is written).
// Written into "<name>.tmp", each file fsynced, the directory renamed, and the COMPLETE marker
// written last: a checkpoint without COMPLETE is never loaded, so a crash mid-write leaves the
// previous checkpoint as the newest complete one.
#pragma once
#include <functional>
#include <optional>
#include <vector>
#include <string>

#include <nlohmann/json.hpp>

#include "model/transformer.h"
#include "train/config.h"
#include "train/optimizer.h"

namespace jtok {

std::string checkpoint_dir_name(int64_t step);

// trainer_state: step, RNG and data loader state, schedule; saved verbatim as trainer_state.json.
std::string save_checkpoint(const std::string& run_dir, int64_t step, const Config& cfg, const Model& m,
                            const AdamWState& opt, const nlohmann::json& trainer_state, int64_t keep_last);

// One rank's rows of one token table (a shard: dist::ShardedTables), current, for a checkpoint
// written in place: local row r is global row global(r) of a table of V rows of dim floats.
struct TableRows {
  int64_t V = 0, dim = 0, rows = 0;
  std::function<int64_t(int64_t r)> global;
  const float *w = nullptr, *m = nullptr, *v = nullptr;  // values and AdamW moments, (rows, dim)
};
// save_checkpoint for a run whose tables are sharded over the ranks (embedding parallelism): the same files,
// byte for byte, as save_checkpoint of the gathered model, and no rank ever holds a whole table.
// Every rank calls it with its rows of every table (m.tables without rows, opt without table
// moments). Rank 0 creates the temp directory and the two safetensors files pre-sized, header and
// backbone tensors written, the tables' spans left to the ranks; after a barrier every rank
// pwrites its rows (values into model.safetensors, moments into optimizer.safetensors) at their
// offsets and fsyncs; after a second barrier rank 0 writes trainer_state.json and config.json,
// renames the directory and writes COMPLETE last. The run directory must be one file system seen
// by every rank with POSIX semantics for writes to disjoint byte ranges (a local disk, Lustre, GPFS).
std::string save_checkpoint_sharded(const std::string& run_dir, int64_t step, const Config& cfg, const Model& m,
                                    const AdamWState& opt, const nlohmann::json& trainer_state, int64_t keep_last,
                                    const std::vector<TableRows>& mine);

// Newest complete checkpoint directory under run_dir/checkpoints, if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);

// The config stored with a checkpoint (config.json), validated.
Config load_checkpoint_config(const std::string& ckpt_dir);
// Loads the weights into m (built from the checkpoint's config); with opt, the optimizer state too
// (training: a checkpoint with bf16 / int8 / int4 tables, an inference export, is refused).
// Returns trainer_state.json. Errors name the file on anything missing, truncated or mismatched.
// tables = false: the tables and their moments are checked but not read (m built with
// ModelAlloc{.tables = false}; opt gets no table moments): each rank of an embedding-parallel run
// then reads its own rows (dist::ShardedTables from the checkpoint).
nlohmann::json load_checkpoint(const std::string& ckpt_dir, Model& m, AdamWState* opt, bool tables = true);
// Inference only: the weights of a complete checkpoint with its token tables left in
// model.safetensors, mapped read-only and read in place (load_weights_mapped).
void load_checkpoint_mapped(const std::string& ckpt_dir, Model& m);

}  // namespace jtok
