// The disk placement (--tables disk): rows, moments and row steps in a training store
// (train/disk_tables.h), read a step ahead, flushed before a checkpoint is complete and sealed after.
#pragma once
#include <memory>

#include "train/table_placement.h"

namespace jtok {

// --tables disk's options against the model and the ranks (sharded: --embp asks for shards too):
// refused naming what to run instead.
void check_disk_table_options(const TableRunParts& p, bool sharded);
std::unique_ptr<TablePlacement> make_tables_on_disk(const TableRunParts& p);

}  // namespace jtok
