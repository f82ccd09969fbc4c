// `jtok export --format jtok`: a checkpoint made into an inference copy, a checkpoint directory
// (model.safetensors, config.json, trainer_state.json naming the source, COMPLETE) that generate /
// eval / serve load as usual, or its token tables alone as a token-major store (model/table_store.h)
// for --tables disk. The command parses the flags; the work is here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/transformer.h"
#include "store/table_store.h"
#include "train/config.h"

namespace jtok {

struct InferenceCopyOptions {
  bool fold_jtok = false;           // store JTok's gate table G = s * Norm(E) (export/fold.h)
  Dtype table_dtype = Dtype::f32;   // every token table: f32, bf16, int8 or int4 (quantize_table)
  Dtype weight_dtype = Dtype::f32;  // the projections, experts, embedding and head: f32, bf16 or int8
};

// An export reads fp32 weights: a model with low-precision matrices (itself an export) is refused,
// naming `origin` (its checkpoint directory).
void refuse_lowp_source(const Model& m, const std::string& origin);

// The model as it is exported, changed in place: its tables checked to be f32 (an export's are
// refused), JTok folded with fold_jtok (cfg follows: jtok_norm false; an error without JTok
// layers), every table quantized to table_dtype. Returns the JTok tables folded.
int64_t prepare_export_model(Model& m, ModelConfig& cfg, const std::string& origin, const InferenceCopyOptions& opt);

// Writes the inference copy `out` (a new directory, published whole by publish_dir_atomic):
// the weights in weight_dtype, config.json of cfg, trainer_state.json naming origin and the options,
// and when origin has a tokenizer.json (an imported model) its tokenizer files and eos_ids.
void write_inference_copy(const Model& m, const Config& cfg, const std::string& origin, const std::vector<int32_t>& eos_ids,
                          const std::string& out, const InferenceCopyOptions& opt);

// A table store's source (its manifest names it): the checkpoint directory's name and its step
// (trainer_state.json's; an inference copy has none).
TableStoreSource checkpoint_source(const std::string& dir);

}  // namespace jtok
