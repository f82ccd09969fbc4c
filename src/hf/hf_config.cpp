#include "hf/hf_config.h"

#include <algorithm>
#include <cmath>
#include <map>
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
}

// rope_scaling: null, type "default", or Llama 3's (rope_type, or the legacy "type", "llama3"),
// whose four parameters HF requires too.
void apply_rope_scaling(const Fields& f, ModelConfig& m) {
  if (!f.has("rope_scaling")) return;
  const json& rs = f.j.at("rope_scaling");
  const std::string kind = rs.is_object() ? rs.value("rope_type", rs.value("type", std::string("?"))) : "?";
  if (kind == "default") return;
  if (kind != "llama3")
    unsupported(f.path, "rope_scaling", rs, "rope scaling type '" + kind + "' is not implemented (known: llama3)");
  const std::string where = f.path + ": field rope_scaling";
  const Fields r{rs, where};
  m.rope_scaling_type = "llama3";
  m.rope_scaling_factor = r.number("factor", std::nan(""));
  m.rope_scaling_low_freq_factor = r.number("low_freq_factor", std::nan(""));
  m.rope_scaling_high_freq_factor = r.number("high_freq_factor", std::nan(""));
  m.rope_scaling_original_max_position_embeddings = r.integer("original_max_position_embeddings");
  for (const char* k : {"factor", "low_freq_factor", "high_freq_factor"})
    if (!r.has(k)) fail(where, ": field ", k, " is missing (llama3 rope scaling needs it)");
}

// Qwen3-MoE's mlp_only_layers (a list of layer indices) in jtok's layer-list syntax ("0,3").
std::string mlp_only_layers_of(const Fields& f, int64_t layers) {
  if (!f.has("mlp_only_layers")) return "";
  const json& v = f.j.at("mlp_only_layers");
  if (!v.is_array()) unsupported(f.path, "mlp_only_layers", v, "expected a list of layer indices");
  std::string out;
  for (const json& x : v) {
    const auto l = json_int64(x);
    if (!l || *l < 0 || *l >= layers) unsupported(f.path, "mlp_only_layers", v, "expected layer indices in [0, num_hidden_layers)");
    if (!out.empty()) out += ',';
    out += std::to_string(*l);
  }
  return out;
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
  m.decoder_sparse_step = f.integer("decoder_sparse_step", 1);
  m.mlp_only_layers = mlp_only_layers_of(f, m.num_hidden_layers);
}

// The mapping of an HF config object (errors name the file, field and value; json::exception
// escapes for a nested field of an unexpected type, caught by the caller).
HfModelInfo model_config_from_object(const json& j, const std::string& path, int64_t max_positions) {
  const Fields f{j, path};
  HfModelInfo info;
  info.hf_model_type = f.string("model_type", "");
  const std::string& type = info.hf_model_type;
  if (type != "llama" && type != "qwen2" && type != "qwen3" && type != "qwen3_moe")
    fail(path, ": model_type '", type, "' is not supported (known: llama, qwen2, qwen3, qwen3_moe)");
  check_common(f, type);
  info.model = dense_shape(f);
  info.model.qk_norm = type == "qwen3" || type == "qwen3_moe";  // self_attn.q_norm / k_norm
  info.model.attention_bias = type == "qwen2";                  // q/k/v biases, always in Qwen2
  apply_rope_scaling(f, info.model);
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

}  // namespace

int64_t pad_multiple_for(int64_t v) {
  for (int64_t m = 64; m > 1; m /= 2)
    if (v % m == 0) return m;
  return 1;
}

HfModelInfo model_config_from_hf(const json& j, const std::string& path, int64_t max_positions) {
  if (!j.is_object()) fail(path, ": expected a JSON object");
  try {
    return model_config_from_object(j, path, max_positions);
  } catch (const json::exception& e) {  // a field of an unexpected type inside an object (rope_scaling's)
    fail(path, ": malformed field (", e.what(), ")");
  }
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

namespace {

// The HF architecture of a jtok model, or fails naming what none has.
std::string hf_type_of(const ModelConfig& m, const std::string& origin) {
  if (m.jtok || m.jtokm)
    fail(origin, ": the model has ", m.jtok ? "JTok" : "JTok-M", " tables (token-indexed parameters), which no Hugging Face ",
         "architecture holds; export it with --format jtok (or gguf for a model without tables)");
  if (m.is_moe()) {
    if (!m.qk_norm || m.attention_bias || m.n_shared_experts > 0)
      fail(origin, ": a jtok_moe model is Hugging Face's qwen3_moe only with qk_norm, no attention_bias and no shared ",
           "experts (this one: qk_norm ", m.qk_norm, ", attention_bias ", m.attention_bias, ", n_shared_experts ",
           m.n_shared_experts, ")");
    return "qwen3_moe";
  }
  if (m.qk_norm && m.attention_bias)
    fail(origin, ": qk_norm with attention_bias has no Hugging Face architecture (qwen3's attention_bias also biases o_proj)");
  if (m.qk_norm) return "qwen3";
  if (m.attention_bias) {
    if (m.hd() * m.num_attention_heads != m.hidden_size)
      fail(origin, ": attention_bias with head_dim ", m.hd(), " != hidden_size / num_attention_heads: qwen2 has no head_dim field");
    return "qwen2";
  }
  return "llama";
}

// Qwen3-MoE's layer choice: decoder_sparse_step as it is, and as mlp_only_layers every layer the
// step would make MoE that jtok keeps dense (first_k_dense_replace, mlp_only_layers).
json qwen3_moe_fields(const ModelConfig& m) {
  json dense = json::array();
  for (int64_t l = 0; l < m.num_hidden_layers; ++l)
    if ((l + 1) % m.decoder_sparse_step == 0 && !m.moe_on_layer(l)) dense.push_back(l);
  return {{"num_experts", m.n_routed_experts}, {"num_experts_per_tok", m.num_experts_per_tok},
          {"moe_intermediate_size", m.moe_intermediate_size}, {"norm_topk_prob", m.norm_topk_prob},
          {"router_aux_loss_coef", m.router_aux_loss_coef}, {"decoder_sparse_step", m.decoder_sparse_step},
          {"mlp_only_layers", dense}, {"output_router_logits", false}};
}

}  // namespace

json hf_config_from_model(const ModelConfig& m, const std::string& origin) {
  const std::string type = hf_type_of(m, origin);
  static const std::map<std::string, std::string> arch = {{"llama", "LlamaForCausalLM"}, {"qwen2", "Qwen2ForCausalLM"},
                                                          {"qwen3", "Qwen3ForCausalLM"}, {"qwen3_moe", "Qwen3MoeForCausalLM"}};
  json j;
  j["architectures"] = json::array({arch.at(type)});
  j["model_type"] = type;
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.hidden_size;
  j["intermediate_size"] = m.intermediate_size;
  j["num_hidden_layers"] = m.num_hidden_layers;
  j["num_attention_heads"] = m.num_attention_heads;
  j["num_key_value_heads"] = m.num_key_value_heads;
  if (type != "qwen2") j["head_dim"] = m.hd();
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = m.max_position_embeddings;
  j["rms_norm_eps"] = m.rms_norm_eps;
  j["rope_theta"] = m.rope_theta;
  j["rope_scaling"] = nullptr;
  if (m.rope_scaling_type == "llama3")
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", m.rope_scaling_factor},
                         {"low_freq_factor", m.rope_scaling_low_freq_factor},
                         {"high_freq_factor", m.rope_scaling_high_freq_factor},
                         {"original_max_position_embeddings", m.rope_scaling_original_max_position_embeddings}};
  j["tie_word_embeddings"] = m.tie_word_embeddings;
  if (type != "qwen2") j["attention_bias"] = false;  // qwen2: q/k/v biases always, no field
  if (type == "llama") j["mlp_bias"] = false;
  if (type != "llama") j["use_sliding_window"] = false;
  if (type == "qwen3_moe") j.update(qwen3_moe_fields(m));
  j["initializer_range"] = m.initializer_range;
  return j;
}

}  // namespace jtok
