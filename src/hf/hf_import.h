// `jtok import`: a Hugging Face model directory (config.json, model.safetensors or a sharded index,
// tokenizer.json, generation_config.json) -> an ordinary jtok checkpoint at step 0 (docs/import.md).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace jtok {

struct ImportOptions {
  std::string from, out;
  int64_t max_positions = 0;   // > 0: max_position_embeddings of the checkpoint (default: the HF value, capped)
  bool require_tokenizer = true;
  // Called after each tensor is written: bytes of model.safetensors written so far, and its size.
  std::function<void(uint64_t done, uint64_t total)> progress;
};
struct ImportReport {
  std::string hf_model_type;
  int64_t tensors = 0, params = 0;
  uint64_t bytes = 0;          // model.safetensors written
  std::string tokenizer;       // "" when the checkpoint has none of its own
};

// Everything is checked (config, every tensor's presence, dtype and shape, the tokenizer) before a
// byte is written; the checkpoint is written under out + ".tmp", fsynced, renamed, COMPLETE last.
// Weights stream one chunk of one tensor at a time from the source into the output file, converted
// to f32: memory stays a few tens of MB whatever the model's size. Errors name the file and the
// tensor or field; on any error nothing exists under `out`.
ImportReport import_hf(const ImportOptions& opt);

}  // namespace jtok
