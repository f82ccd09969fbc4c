// Training with the token tables in a training store on disk (`jtok train --tables disk
// --table-store DIR`, store/train_table_store.h): the model's tables become the store's, the one
// table optimizer updates their rows through it, and a checkpoint neither copies nor syncs the
// tables: the store is flushed (its undo log then says so) before the checkpoint is complete and
// sealed after, and the checkpoint keeps, in table_store.json, the AdamW constants of the steps
// whose replay rows may still owe (TableMoments::consts), so a resumed run continues bit for bit.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "store/train_table_store.h"
#include "model/transformer.h"
#include "train/table_optimizer.h"

namespace jtok {

// The store at dir for m's tables, which it then holds: made (a fresh run, at step 0) when
// resume_step is empty, else opened at that checkpoint step (rolled back to it). A fresh store is
// made from the random init of *init_seed (make_model's values, token block by token block: m's
// tables need no storage, the peak memory is one unit, not a table), or without init_seed from m's
// tables in RAM (--init-from). A fresh run whose store already exists reopens it at step 0 when
// `reuse` (a --resume that found no checkpoint), else is refused. Names and shapes are checked
// against m's. io_threads: the store's read-ahead threads; io: how it reads its file
// (TrainTableStore::open).
std::shared_ptr<TrainTableStore> attach_disk_tables(Model& m, const std::string& dir, int64_t cache_bytes,
                                                    std::optional<int64_t> resume_step, bool reuse, int io_threads = 4,
                                                    TableIo io = TableIo::pread, const uint64_t* init_seed = nullptr);

// Writes f32 tables (whole tables of the same ids, in memory) as a training store at dir with zero
// moments and every row at `step` (TrainTableStore::create from their rows); dir must not exist.
void create_train_store(const std::string& dir, const std::vector<TokenTable>& tables, const std::vector<std::string>& names,
                        int64_t step);

// table_store.json of a checkpoint: the store's directory and the kept constants (as float bits).
nlohmann::json kept_steps_json(const std::string& store_dir, const TableMoments& st);
// Restores them into st (whose rows' steps are in the store); where: the file, for errors.
void restore_kept_steps(TableMoments& st, const nlohmann::json& j, const std::string& where);

}  // namespace jtok
