// `jtok export --format hf`: a checkpoint as a Hugging Face model directory (config.json with HF's
// field names, model.safetensors with HF's tensor names, the tokenizer files when the checkpoint has
// them) that `jtok import` reads back and Hugging Face's loader reads by names and layout
// (docs/import.md "Export to Hugging Face").
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/transformer.h"

namespace jtok {

struct HfExportOptions {
  std::string dtype = "bf16";   // tensors' dtype in the file: "bf16" (round to nearest even) or "f32" (exact)
  std::string tokenizer_dir;    // a directory holding tokenizer.json to copy ("": none)
  int64_t eos_token_id = -1;    // config.json's eos_token_id (-1: none)
};

// Writes `out` (a new directory: temp name, fsync, rename). The embedding and the untied LM head
// are written with their vocab_size real rows only (jtok's padded rows are zero and never win a
// softmax; HF has no masked rows, so the exported model computes jtok's distribution exactly); a
// tied model has no lm_head.weight, as HF writes it. Refuses, before writing anything, a model HF
// has no architecture for (token tables, shared experts, ...). Returns model.safetensors' size.
uint64_t export_hf(const Model& m, const std::string& origin, const std::string& out, const HfExportOptions& opt);

}  // namespace jtok
