// Moving a rank's shard rows in and out of whole tables: from a checkpoint file (each rank reads
// only its rows) and to rank 0 (the gathered-checkpoint reference). Any per-row array of a shard
// moves this way: the table's values, and the AdamW moments the trainer keeps beside them.
#pragma once
#include <cstdint>
#include <string>

#include "dist/embedding_parallel.h"
#include "io/safetensors.h"

namespace jtok::dist {

// dst (shard.rows, dim) = the rows `shard` holds (its id-to-row map) of tensor `name` in the
// safetensors file idx, which must be F32 of shape [shard.id_count, shard.dim] (else it fails
// naming the file and tensor). Reads blocks of 4096 rows, never the whole tensor.
void read_owned_rows(const StIndex& idx, const std::string& name, const TokenTable& shard, float* dst);

// A collective: rank 0 gets whole (id_count, dim) = every rank's rows (rows (shard.rows, dim) in
// shard-row order) at their ids; other ranks pass whole = nullptr.
void gather_rows_to_root(const RowOwner& own, const TokenTable& shard, const float* rows, float* whole);

}  // namespace jtok::dist
