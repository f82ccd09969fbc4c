#include "hf/hf_config.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "core/json_int.h"

namespace jtok {

namespace {

using json = nlohmann::json;

// Typed reads of config.json fields; errors name the file, the field and the value found.
struct Fields {
  const json& j;
  const std::string& path;

  bool has(const char* k) const { return j.contains(k) && !j.at(k).is_null(); }
  int64_t integer(const char* k, std::optional<int64_t> dflt = std::nullopt) const {
    if (!has(k)) {
      if (dflt) return *dflt;
      fail(path, ": field ", k, " is missing");
    }
    const auto v = json_int64(j.at(k), /*integral_floats=*/true);
    if (!v) fail(path, ": field ", k, ": expected an integer, got ", j.at(k).dump());
    return *v;
  }
  double number(const char* k, double dflt) const {
    if (!has(k)) return dflt;
    if (!j.at(k).is_number()) fail(path, ": field ", k, ": expected a number, got ", j.at(k).dump());
    return j.at(k).get<double>();
  }
  bool boolean(const char* k, bool dflt) const {
    if (!has(k)) return dflt;
    if (!j.at(k).is_boolean()) fail(path, ": field ", k, ": expected true or false, got ", j.at(k).dump());
    return j.at(k).get<bool>();
  }
  std::string string(const char* k, const std::string& dflt) const {
    if (!has(k)) return dflt;
    if (!j.at(k).is_string()) fail(path, ": field ", k, ": expected a string, got ", j.at(k).dump());
    return j.at(k).get<std::string>();
  }
};

// A setting the model does not implement: refused naming the field and its value.
[[noreturn]] void unsupported(const std::string& path, const char* field, const json& value, const std::string& why) {
  fail(path, ": field ", field, " = ", value.dump(), ": ", why);
}

// The settings every architecture shares; refusals of what jtok does not compute.
void check_common(const Fields& f, const std::string& type) {
  if (const std::string act = f.string("hidden_act", "silu"); act != "silu")
    unsupported(f.path, "hidden_act", f.j.at("hidden_act"), "jtok's MLP is SwiGLU (silu) only");
  if (f.boolean("use_sliding_window", false))
    unsupported(f.path, "use_sliding_window", f.j.at("use_sliding_window"), "sliding-window attention is not implemented");
  if (f.boolean("mlp_bias", false)) unsupported(f.path, "mlp_bias", f.j.at("mlp_bias"), "jtok's MLP has no biases");
  if (type != "qwen2" && f.boolean("attention_bias", false))
    unsupported(f.path, "attention_bias", f.j.at("attention_bias"),
                "an " + type + " model with attention_bias also biases o_proj, which jtok does not have");
  if (f.has("rope_scaling")) {
    const json& rs = f.j.at("rope_scaling");
    const std::string kind = rs.is_object() ? rs.value("rope_type", rs.value("type", std::string("?"))) : "?";
    if (kind == "llama3")
      unsupported(f.path, "rope_scaling", rs, "Llama 3 rope scaling is not in this build's model yet");
    if (kind != "default")
      unsupported(f.path, "rope_scaling", rs, "rope scaling type '" + kind + "' is not implemented (known: llama3)");
  }
}

// The dense shape (every architecture).
ModelConfig dense_shape(const Fields& f) {
  ModelConfig m;
  m.model_type = "jtok_dense";
  m.vocab_size = f.integer("vocab_size");
  m.vocab_pad_multiple = m.vocab_size > 0 ? pad_multiple_for(m.vocab_size) : 1;
  m.hidden_size = f.integer("hidden_size");
  m.intermediate_size = f.integer("intermediate_size");
  m.num_hidden_layers = f.integer("num_hidden_layers");
  m.num_attention_heads = f.integer("num_attention_heads");
  m.num_key_value_heads = f.integer("num_key_value_heads", m.num_attention_heads);
  m.head_dim = f.integer("head_dim", 0);
  m.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  m.rope_theta = f.number("rope_theta", 10000.0);
  m.max_position_embeddings = f.integer("max_position_embeddings", 2048);
  m.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  m.initializer_range = f.number("initializer_range", 0.02);
  return m;
}

void apply_moe(const Fields& f, ModelConfig& m) {
  m.model_type = "jtok_moe";
  m.first_k_dense_replace = 0;
  m.n_routed_experts = f.integer("num_experts");
  m.num_experts_per_tok = f.integer("num_experts_per_tok");
  m.moe_intermediate_size = f.integer("moe_intermediate_size");
  m.n_shared_experts = 0;
  m.norm_topk_prob = f.boolean("norm_topk_prob", false);
  m.router_aux_loss_coef = f.number("router_aux_loss_coef", 0.001);
  if (f.integer("decoder_sparse_step", 1) != 1)
    unsupported(f.path, "decoder_sparse_step", f.j.at("decoder_sparse_step"), "MoE on every k-th layer is not in this build's model yet");
  if (f.has("mlp_only_layers") && !f.j.at("mlp_only_layers").empty())
    unsupported(f.path, "mlp_only_layers", f.j.at("mlp_only_layers"), "dense layers among MoE ones are not in this build's model yet");
}

}  // namespace

int64_t pad_multiple_for(int64_t v) {
  for (int64_t m = 64; m > 1; m /= 2)
    if (v % m == 0) return m;
  return 1;
}

HfModelInfo model_config_from_hf(const json& j, const std::string& path, int64_t max_positions) {
  if (!j.is_object()) fail(path, ": expected a JSON object");
  const Fields f{j, path};
  HfModelInfo info;
  info.hf_model_type = f.string("model_type", "");
  const std::string& type = info.hf_model_type;
  if (type != "llama" && type != "qwen2" && type != "qwen3" && type != "qwen3_moe")
    fail(path, ": model_type '", type, "' is not supported (known: llama, qwen2, qwen3, qwen3_moe)");
  check_common(f, type);
  info.model = dense_shape(f);
  if (type == "qwen3" || type == "qwen3_moe")
    fail(path, ": model_type ", type, " has QK-norm (self_attn.q_norm / k_norm), which this build's model does not have yet");
  if (type == "qwen2") fail(path, ": model_type qwen2 has q/k/v projection biases, which this build's model does not have yet");
  if (type == "qwen3_moe") apply_moe(f, info.model);
  info.hf_max_position_embeddings = info.model.max_position_embeddings;
  const int64_t cap = max_positions > 0 ? max_positions : kImportPositionCap;
  if (max_positions > 0 || info.model.max_position_embeddings > cap) info.model.max_position_embeddings = cap;
  info.eos_token_ids = eos_ids_of(j, path);
  Config c;
  c.model = info.model;
  c.train.seq_len = std::min<int64_t>(c.train.seq_len, c.model.max_position_embeddings);
  validate(c, path + " (as a jtok config)");
  return info;
}

std::vector<int64_t> eos_ids_of(const json& j, const std::string& path) {
  std::vector<int64_t> ids;
  if (!j.contains("eos_token_id") || j.at("eos_token_id").is_null()) return ids;
  const json& e = j.at("eos_token_id");
  for (const json& v : e.is_array() ? e : json::array({e})) {
    const auto id = json_int64(v);
    if (!id || *id < 0) fail(path, ": field eos_token_id: expected an id or a list of ids, got ", e.dump());
    ids.push_back(*id);
  }
  return ids;
}

json hf_config_from_model(const ModelConfig& m, const std::string& origin) {
  if (m.jtok || m.jtokm)
    fail(origin, ": the model has ", m.jtok ? "JTok" : "JTok-M", " tables (token-indexed parameters), which no Hugging Face ",
         "architecture holds; export it with --format jtok (or gguf for a model without tables)");
  if (m.is_moe())
    fail(origin, ": a jtok_moe model maps to Hugging Face's qwen3_moe only with QK-norm and no shared experts, ",
         "which this build's model does not have yet");
  json j;
  j["architectures"] = json::array({"LlamaForCausalLM"});
  j["model_type"] = "llama";
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.hidden_size;
  j["intermediate_size"] = m.intermediate_size;
  j["num_hidden_layers"] = m.num_hidden_layers;
  j["num_attention_heads"] = m.num_attention_heads;
  j["num_key_value_heads"] = m.num_key_value_heads;
  j["head_dim"] = m.hd();
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = m.max_position_embeddings;
  j["rms_norm_eps"] = m.rms_norm_eps;
  j["rope_theta"] = m.rope_theta;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = m.tie_word_embeddings;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["initializer_range"] = m.initializer_range;
  return j;
}

}  // namespace jtok
