// The sharded placement (--embp under mpirun): each rank holds the rows it owns of every table
// (dist::ShardedTables) with their moments and optimizer (train/shard_optimizer.h).
#pragma once
#include <memory>

#include "train/table_placement.h"

namespace jtok {

std::unique_ptr<TablePlacement> make_sharded_tables(const TableRunParts& p);

}  // namespace jtok
