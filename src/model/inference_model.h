// A randomly initialised model for inference benchmarks (`jtok bench-decode`): make_model's values
// without gradient buffers, the token tables made side by side and stored as f32 or bf16. A
// Qwen3-0.6B-shape JTok-M model (n_e 5 on 28 layers: 140 tables of 151,936 x 1,024) holds 87 GB of
// f32 tables, 43.5 GB in bf16: bf16 rows are made one at a time from make_model's init stream and
// rounded (nearest even), so no f32 table ever exists whole.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "model/transformer.h"

namespace jtok {

// make_model(cfg, seed) without gradients; tables in table_dtype (f32: make_model's tables, bit for
// bit; bf16: quantize_table of them, bit for bit). Fails naming any other dtype.
Model make_inference_model(const ModelConfig& cfg, uint64_t seed, Dtype table_dtype);
// The same model with its tables' names, shapes and init streams but no storage (a store on disk
// gives them rows: infer/random_table_store.h, model/table_attach.h).
Model make_inference_model_without_tables(const ModelConfig& cfg, uint64_t seed);

// The token tables cfg's model holds: one a JTok layer, n_e a JTok-M layer.
int64_t token_table_count(const ModelConfig& cfg);
// Bytes the token tables of cfg take in dtype dt (f32 or bf16): tables x padded vocab x d x size.
int64_t table_bytes(const ModelConfig& cfg, Dtype dt);

}  // namespace jtok
