// Hugging Face config.json <-> jtok ModelConfig, for the architectures whose tensors jtok computes
// exactly (docs/import.md): llama, qwen2, qwen3 (dense) and qwen3_moe. Anything else, or a setting
// the engine does not implement (sliding window, rope scaling other than llama3, an activation
// other than silu, biases jtok does not have), is refused naming the file, the field and its value.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/config.h"

namespace jtok {

// What an HF config says beyond the model's shape.
struct HfModelInfo {
  ModelConfig model;
  std::string hf_model_type;             // "llama" | "qwen2" | "qwen3" | "qwen3_moe"
  int64_t hf_max_position_embeddings = 0;// before the cap (import_position_cap)
  std::vector<int64_t> eos_token_ids;    // config.json's eos_token_id (an id or a list)
};

// The longest sequence an imported model is set up for unless asked otherwise: it sizes the rope
// table ((T, head_dim/2) cos and sin) and nothing else; HF configs say up to 131072.
constexpr int64_t kImportPositionCap = 32768;

// config.json (parsed, `path` names it in errors) -> ModelConfig. max_positions > 0 replaces the cap.
HfModelInfo model_config_from_hf(const nlohmann::json& j, const std::string& path, int64_t max_positions = 0);
// The reverse: config.json for Hugging Face (model_type from the model's features, its field
// names, "architectures"), or fails naming what no HF architecture has (token tables, shared
// experts, ...). `origin` names the checkpoint in errors.
nlohmann::json hf_config_from_model(const ModelConfig& m, const std::string& origin);
// The eos ids of generation_config.json (an id or a list; empty when absent).
std::vector<int64_t> eos_ids_of(const nlohmann::json& j, const std::string& path);
// Files of an HF directory that travel beside the weights when present (the tokenizer's, and the
// generation defaults: eos ids, sampling settings): import copies them in, export --format hf out.
inline constexpr const char* kHfSideFiles[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                               "generation_config.json"};
// The largest of 64, 32, ..., 1 dividing v: the vocab_pad_multiple under which v rows need no padding.
int64_t pad_multiple_for(int64_t v);

}  // namespace jtok
