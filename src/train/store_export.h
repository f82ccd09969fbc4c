// The token tables of a checkpoint trained with --tables disk (its table_store.json names the
// training store, train/disk_tables.h) as a read-only token-major store (store/table_store.h) for
// `--tables disk --table-store OUT`: `jtok export --checkpoint CK --table-store OUT
// [--table-dtype bf16|int8|int4]`. Streamed token by token: the training store read as it was at the
// checkpoint's step without writing to it (store/train_store_snapshot.h), one unit at a time in
// token order; each row brought to that step with the AdamW constants the checkpoint keeps
// (replay_steps: the bits a run with RAM tables has at that checkpoint); stored as f32, bf16, int8 or int4
// row by row. No whole table is ever in memory.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "model/transformer.h"
#include "store/table_store.h"

namespace jtok {

// The training store a checkpoint keeps its tables in (table_store.json's "store"), or none: the
// tables are in model.safetensors.
std::optional<std::string> disk_tables_store(const std::string& ckpt_dir);

struct StoreExportStats {
  int64_t ids = 0, tables = 0;
  int64_t units_from_log = 0;  // training-store units read from its undo log (overwritten since the step)
  int64_t rows_replayed = 0;   // rows brought to the checkpoint's step by replayed AdamW steps
};
// m: the checkpoint's model (names and shapes; its tables need no storage). out must not exist.
StoreExportStats export_disk_tables(const std::string& ckpt_dir, const Model& m, const std::string& out, Dtype dt);

// Writes tables (all of the same rows, any dtype, in memory) as a token-major store at dir (`jtok
// export --table-store` of a checkpoint whose tables are in model.safetensors): a temp directory,
// every file fsynced, renamed to dir; dir must not exist.
void write_table_store(const std::string& dir, const std::vector<TokenTable>& tables, const std::vector<std::string>& names,
                       const TableStoreSource& source = {});

}  // namespace jtok
