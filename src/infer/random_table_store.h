// A random model's token tables written straight into a token-major table store (store/table_store.h)
// for benchmarks of `--tables disk` without a checkpoint (`jtok bench-decode --config C --tables disk
// --table-store DIR`). The rows are make_inference_model's (make_model's init values, TableInitStream,
// or the hash's: model/inference_model.h) stored as it stores them (f32, or bf16 rounded to nearest
// even), bit for bit: the store's model decodes as the one with its tables in RAM. They are made a
// chunk of ids at a time, every table side by side, so no table is ever whole in memory (a
// Qwen3-0.6B-shape JTok-M model's 43.6 GB of bf16 rows go to disk through ~150 MB: two chunks, the
// next made while this one is written).
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "model/inference_model.h"
#include "model/transformer.h"

namespace jtok {

// m: the random model (make_inference_model_without_tables: its tables' names, shapes and init streams). Writes
// the store at dir (which must not exist: a temp directory, fsynced, renamed), its tables in dt (f32
// or bf16) holding make_inference_model(m.cfg, seed, dt, values)'s rows, its source a random model's
// ("seed S, table values V"). Returns the bytes of its data file.
int64_t write_random_table_store(const Model& m, uint64_t seed, Dtype dt, const std::string& dir,
                                 TableValues values = TableValues::init);

}  // namespace jtok
