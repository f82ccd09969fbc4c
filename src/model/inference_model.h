// A randomly initialised model for inference benchmarks (`jtok bench-decode`): make_model's values
// without gradient buffers, the token tables made side by side and stored as f32 or bf16. A
// Qwen3-0.6B-shape JTok-M model (n_e 5 on 28 layers: 140 tables of 151,936 x 1,024) holds 87 GB of
// f32 tables, 43.5 GB in bf16: bf16 rows are made one at a time from make_model's init stream and
// rounded (nearest even), so no f32 table ever exists whole.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "model/transformer.h"

namespace jtok {

// Where a random model's table values come from. init: make_model's init streams (the values a
// training run starts from), a stream a table made row after row (~22 ns a value a thread here).
// hash: each value a function of the seed, the table's stream and its index alone, N(0, std)
// approximated by the sum of four 16-bit uniforms (within +-3.46 std), any rows in any order, ~1.7
// ns a value a thread (~13x faster): a benchmark's tables, whose values no timing depends on.
enum class TableValues { init, hash };
// "init" or "hash"; anything else fails naming flag and value.
TableValues parse_table_values(const std::string& s, const char* flag);
const char* table_values_name(TableValues v);
// Row id of table k of m (make_model's or a shape-only model) by the hash: d values, 0 on padded rows.
void hash_table_row(const Model& m, uint64_t seed, int64_t k, int64_t id, float* out);

// make_model(cfg, seed) without gradients; tables in table_dtype (f32: make_model's tables, bit for
// bit, or the hash's rows; bf16: quantize_table of them, bit for bit). Fails naming any other dtype.
Model make_inference_model(const ModelConfig& cfg, uint64_t seed, Dtype table_dtype,
                           TableValues values = TableValues::init);
// The same model with its tables' names, shapes and init streams but no storage (a store on disk
// gives them rows: infer/random_table_store.h, model/table_attach.h).
Model make_inference_model_without_tables(const ModelConfig& cfg, uint64_t seed);

// The token tables cfg's model holds: one a JTok layer, n_e a JTok-M layer.
int64_t token_table_count(const ModelConfig& cfg);
// Bytes the token tables of cfg take in dtype dt (f32 or bf16): tables x padded vocab x d x size.
int64_t table_bytes(const ModelConfig& cfg, Dtype dt);

}  // namespace jtok
