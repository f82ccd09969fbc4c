#include "train/config.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/json_int.h"

namespace jtok {

int64_t TrainConfig::resolved_warmup_steps() const {
  if (warmup_steps >= 0) return warmup_steps;
  return static_cast<int64_t>(std::llround(warmup_ratio * static_cast<double>(max_steps)));
}

namespace {

// One entry per field: how to read it from JSON, how to parse it from a command-line string,
// and how to write it back. Keeps the schema in one table.
struct Field {
  std::function<void(Config&, const nlohmann::json&, const std::string&)> read;
  std::function<void(Config&, const std::string&, const std::string&)> parse;
  std::function<nlohmann::json(const Config&)> write;
  const char* type;
  bool is_model = false;  // a model field (goes to config.json) rather than a training one
  bool variant = false;   // a backbone variant's (or a newer training option's) field: written only when it
                          // differs from the default, so a plain model's config.json is what it was before
};

template <typename Section, typename T>
Field field_of(Section Config::*section, T Section::*member, const char* type) {
  Field f;
  f.type = type;
  f.is_model = std::is_same_v<Section, ModelConfig>;
  f.read = [=](Config& c, const nlohmann::json& v, const std::string& where) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      static_assert(std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>, "integer fields are 64-bit");
      // A JSON integer in T's range, or an integral float within +-2^53 (a config may say 1e6).
      std::optional<T> x;
      if constexpr (std::is_signed_v<T>) x = json_int64(v, /*integral_floats=*/true);
      else x = json_uint64(v, /*integral_floats=*/true);
      if (!x) fail(where, ": expected ", type, ", got ", v.dump());
      (c.*section).*member = *x;
    } else {
      bool ok;
      if constexpr (std::is_same_v<T, bool>) ok = v.is_boolean();
      else if constexpr (std::is_same_v<T, std::string>) ok = v.is_string();
      else ok = v.is_number();
      if (!ok) fail(where, ": expected ", type, ", got ", v.dump());
      (c.*section).*member = v.get<T>();
    }
  };
  f.parse = [=](Config& c, const std::string& s, const std::string& where) {
    if constexpr (std::is_same_v<T, std::string>) {
      (c.*section).*member = s;
    } else if constexpr (std::is_same_v<T, bool>) {
      if (s == "true" || s == "1") (c.*section).*member = true;
      else if (s == "false" || s == "0") (c.*section).*member = false;
      else fail(where, ": expected true or false, got '", s, "'");
    } else {
      std::istringstream is(s);
      T v{};
      is >> v;
      if (is.fail() || !is.eof()) fail(where, ": expected ", type, ", got '", s, "'");
      (c.*section).*member = v;
    }
  };
  f.write = [=](const Config& c) { return nlohmann::json((c.*section).*member); };
  return f;
}

// The model's backbone fields (and the variants of imported models: `variant`).
void add_backbone_fields(std::map<std::string, Field>& m) {
  using M = ModelConfig;
  auto mf = [&](const char* n, auto M::*p, const char* ty) { m[n] = field_of(&Config::model, p, ty); };
  mf("model_type", &M::model_type, "string");
  mf("vocab_size", &M::vocab_size, "integer");
  mf("vocab_pad_multiple", &M::vocab_pad_multiple, "integer");
  mf("hidden_size", &M::hidden_size, "integer");
  mf("num_hidden_layers", &M::num_hidden_layers, "integer");
  mf("num_attention_heads", &M::num_attention_heads, "integer");
  mf("num_key_value_heads", &M::num_key_value_heads, "integer");
  mf("head_dim", &M::head_dim, "integer");
  mf("intermediate_size", &M::intermediate_size, "integer");
  mf("max_position_embeddings", &M::max_position_embeddings, "integer");
  mf("rope_theta", &M::rope_theta, "number");
  mf("rms_norm_eps", &M::rms_norm_eps, "number");
  mf("tie_word_embeddings", &M::tie_word_embeddings, "boolean");
  mf("initializer_range", &M::initializer_range, "number");
  auto vf = [&](const char* n, auto M::*p, const char* ty) { mf(n, p, ty); m[n].variant = true; };
  vf("qk_norm", &M::qk_norm, "boolean");
  vf("attention_bias", &M::attention_bias, "boolean");
  vf("rope_scaling_type", &M::rope_scaling_type, "string");
  vf("rope_scaling_factor", &M::rope_scaling_factor, "number");
  vf("rope_scaling_low_freq_factor", &M::rope_scaling_low_freq_factor, "number");
  vf("rope_scaling_high_freq_factor", &M::rope_scaling_high_freq_factor, "number");
  vf("rope_scaling_original_max_position_embeddings", &M::rope_scaling_original_max_position_embeddings, "integer");
  vf("mlp_only_layers", &M::mlp_only_layers, "string");
  vf("decoder_sparse_step", &M::decoder_sparse_step, "integer");
}

// The model's JTok, JTok-M and MoE fields.
void add_jtok_moe_fields(std::map<std::string, Field>& m) {
  using M = ModelConfig;
  auto mf = [&](const char* n, auto M::*p, const char* ty) { m[n] = field_of(&Config::model, p, ty); };
  mf("jtok", &M::jtok, "boolean");
  mf("jtok_layers", &M::jtok_layers, "string");
  mf("jtok_eps", &M::jtok_eps, "number");
  mf("jtok_norm", &M::jtok_norm, "boolean");
  mf("jtok_init_std", &M::jtok_init_std, "number");
  mf("jtok_scale_init", &M::jtok_scale_init, "number");
  mf("jtokm", &M::jtokm, "boolean");
  mf("jtokm_layers", &M::jtokm_layers, "string");
  mf("jtokm_n_e", &M::jtokm_n_e, "integer");
  mf("jtokm_top_k", &M::jtokm_top_k, "integer");
  mf("jtokm_aux_loss_coef", &M::jtokm_aux_loss_coef, "number");
  mf("jtokm_eps", &M::jtokm_eps, "number");
  mf("jtokm_norm", &M::jtokm_norm, "boolean");
  mf("jtokm_depth_scaling", &M::jtokm_depth_scaling, "boolean");
  mf("jtokm_init_std", &M::jtokm_init_std, "number");
  mf("jtokm_scale_init", &M::jtokm_scale_init, "number");
  mf("first_k_dense_replace", &M::first_k_dense_replace, "integer");
  mf("n_routed_experts", &M::n_routed_experts, "integer");
  mf("n_shared_experts", &M::n_shared_experts, "integer");
  mf("num_experts_per_tok", &M::num_experts_per_tok, "integer");
  mf("moe_intermediate_size", &M::moe_intermediate_size, "integer");
  mf("router_aux_loss_coef", &M::router_aux_loss_coef, "number");
  mf("norm_topk_prob", &M::norm_topk_prob, "boolean");
}

// The training fields.
void add_train_fields(std::map<std::string, Field>& m) {
  using T = TrainConfig;
  auto tf = [&](const char* n, auto T::*p, const char* ty) { m[n] = field_of(&Config::train, p, ty); };
  tf("seq_len", &T::seq_len, "integer");
  tf("micro_batch_size", &T::micro_batch_size, "integer");
  tf("gradient_accumulation_steps", &T::gradient_accumulation_steps, "integer");
  tf("max_steps", &T::max_steps, "integer");
  tf("learning_rate", &T::learning_rate, "number");
  tf("min_lr", &T::min_lr, "number");
  tf("lr_scheduler_type", &T::lr_scheduler_type, "string");
  tf("table_optimizer", &T::table_optimizer, "string");
  tf("precision", &T::precision, "string");
  tf("warmup_ratio", &T::warmup_ratio, "number");
  tf("warmup_steps", &T::warmup_steps, "integer");
  tf("decay_ratio", &T::decay_ratio, "number");
  tf("weight_decay", &T::weight_decay, "number");
  tf("adam_beta1", &T::adam_beta1, "number");
  tf("adam_beta2", &T::adam_beta2, "number");
  tf("adam_epsilon", &T::adam_epsilon, "number");
  tf("max_grad_norm", &T::max_grad_norm, "number");
  tf("seed", &T::seed, "integer");
  auto tvf = [&](const char* n, auto T::*p, const char* ty) { tf(n, p, ty); m[n].variant = true; };
  tvf("train_only", &T::train_only, "string");
  tvf("table_learning_rate", &T::table_learning_rate, "number");
  tvf("table_dedup", &T::table_dedup, "boolean");
  tvf("table_streams", &T::table_streams, "boolean");
  tf("eval_interval", &T::eval_interval, "integer");
  tf("eval_batches", &T::eval_batches, "integer");
  tf("checkpoint_interval", &T::checkpoint_interval, "integer");
  tf("keep_checkpoints", &T::keep_checkpoints, "integer");
  tf("sample_interval", &T::sample_interval, "integer");
  tf("log_interval", &T::log_interval, "integer");
  tf("train_data", &T::train_data, "string");
  tf("val_data", &T::val_data, "string");
  tf("tokenizer", &T::tokenizer, "string");
  tf("tokenizer_dir", &T::tokenizer_dir, "string");
}

const std::map<std::string, Field>& schema() {
  static const std::map<std::string, Field> s = [] {
    std::map<std::string, Field> m;
    add_backbone_fields(m);
    add_jtok_moe_fields(m);
    add_train_fields(m);
    return m;
  }();
  return s;
}

}  // namespace

std::vector<std::string> config_field_names() {
  std::vector<std::string> names;
  for (auto& [k, v] : schema()) names.push_back(k);
  return names;
}

// The backbone variants' fields (qk_norm and attention_bias need no check).
static void validate_variants(const ModelConfig& m, const std::string& origin) {
  if (m.rope_scaling_type != "none" && m.rope_scaling_type != "llama3")
    fail(origin, ": field rope_scaling_type: unknown value '", m.rope_scaling_type, "' (known: none, llama3)");
  if (m.rope_scaling_type == "llama3") {
    if (!(m.rope_scaling_factor >= 1)) fail(origin, ": field rope_scaling_factor must be >= 1, got ", m.rope_scaling_factor);
    if (!(m.rope_scaling_low_freq_factor > 0 && m.rope_scaling_high_freq_factor > m.rope_scaling_low_freq_factor))
      fail(origin, ": fields rope_scaling_low_freq_factor (", m.rope_scaling_low_freq_factor,
           ") and rope_scaling_high_freq_factor (", m.rope_scaling_high_freq_factor, ") must satisfy 0 < low < high");
    if (m.rope_scaling_original_max_position_embeddings <= 0)
      fail(origin, ": field rope_scaling_original_max_position_embeddings must be positive, got ",
           m.rope_scaling_original_max_position_embeddings);
  }
  if (m.decoder_sparse_step <= 0) fail(origin, ": field decoder_sparse_step must be positive, got ", m.decoder_sparse_step);
  try {
    parse_layer_set(m.mlp_only_layers, m.num_hidden_layers);
  } catch (const Error& e) {
    fail(origin, ": field mlp_only_layers: ", e.what());
  }
}

// A field that must be positive (or >= 0), as the config's origin names it.
static void positive(const std::string& origin, const char* name, double v) {
  if (!(v > 0)) fail(origin, ": field ", name, " must be positive, got ", v);
}
static void nonneg(const std::string& origin, const char* name, double v) {
  if (!(v >= 0)) fail(origin, ": field ", name, " must be >= 0, got ", v);
}

// The backbone: its type, sizes, head layout and the variants of imported models.
static void validate_backbone(const ModelConfig& m, const std::string& origin) {
  if (m.model_type != "jtok_dense" && m.model_type != "jtok_moe")
    fail(origin, ": field model_type: unknown model type '", m.model_type, "' (known: jtok_dense, jtok_moe)");
  positive(origin, "vocab_size", m.vocab_size);
  positive(origin, "vocab_pad_multiple", m.vocab_pad_multiple);
  positive(origin, "hidden_size", m.hidden_size);
  positive(origin, "num_hidden_layers", m.num_hidden_layers);
  positive(origin, "num_attention_heads", m.num_attention_heads);
  positive(origin, "num_key_value_heads", m.num_key_value_heads);
  nonneg(origin, "head_dim", m.head_dim);
  positive(origin, "intermediate_size", m.intermediate_size);
  positive(origin, "max_position_embeddings", m.max_position_embeddings);
  positive(origin, "rope_theta", m.rope_theta);
  positive(origin, "rms_norm_eps", m.rms_norm_eps);
  nonneg(origin, "initializer_range", m.initializer_range);
  if (m.head_dim == 0 && m.hidden_size % m.num_attention_heads != 0)
    fail(origin, ": field num_attention_heads (", m.num_attention_heads, ") must divide hidden_size (",
         m.hidden_size, ")");
  if (m.num_attention_heads % m.num_key_value_heads != 0)
    fail(origin, ": field num_key_value_heads (", m.num_key_value_heads,
         ") must divide num_attention_heads (", m.num_attention_heads, ")");
  if (m.hd() % 2 != 0) fail(origin, ": head dimension ", m.hd(), " must be even for RoPE");
  validate_variants(m, origin);
}

// The token-indexed modules (JTok, JTok-M) and the MoE layers.
static void validate_token_modules_and_moe(const ModelConfig& m, const std::string& origin) {
  try {
    parse_layer_set(m.jtok_layers, m.num_hidden_layers);
  } catch (const Error& e) {
    fail(origin, ": field jtok_layers: ", e.what());
  }
  positive(origin, "jtok_eps", m.jtok_eps);
  try {
    parse_layer_set(m.jtokm_layers, m.num_hidden_layers);
  } catch (const Error& e) {
    fail(origin, ": field jtokm_layers: ", e.what());
  }
  if (m.jtokm) {
    positive(origin, "jtokm_n_e", m.jtokm_n_e);
    positive(origin, "jtokm_top_k", m.jtokm_top_k);
    if (m.jtokm_top_k > m.jtokm_n_e)
      fail(origin, ": field jtokm_top_k (", m.jtokm_top_k, ") exceeds jtokm_n_e (", m.jtokm_n_e, ")");
    if (m.jtokm_n_e > 64) fail(origin, ": field jtokm_n_e (", m.jtokm_n_e, ") exceeds 64 (larger pools are untested)");
    positive(origin, "jtokm_eps", m.jtokm_eps);
    nonneg(origin, "jtokm_aux_loss_coef", m.jtokm_aux_loss_coef);
    nonneg(origin, "jtokm_init_std", m.jtokm_init_std);
  }
  if (m.is_moe()) {
    positive(origin, "n_routed_experts", m.n_routed_experts);
    nonneg(origin, "n_shared_experts", m.n_shared_experts);
    positive(origin, "num_experts_per_tok", m.num_experts_per_tok);
    positive(origin, "moe_intermediate_size", m.moe_intermediate_size);
    nonneg(origin, "router_aux_loss_coef", m.router_aux_loss_coef);
    nonneg(origin, "first_k_dense_replace", m.first_k_dense_replace);
    if (m.num_experts_per_tok > m.n_routed_experts)
      fail(origin, ": field num_experts_per_tok (", m.num_experts_per_tok, ") exceeds n_routed_experts (",
           m.n_routed_experts, ")");
    if (m.first_k_dense_replace > m.num_hidden_layers)
      fail(origin, ": field first_k_dense_replace (", m.first_k_dense_replace, ") exceeds num_hidden_layers (",
           m.num_hidden_layers, ")");
  }
  nonneg(origin, "jtok_init_std", m.jtok_init_std);
}

// The training fields (and how they fit the model: seq_len, tables to train).
static void validate_training(const Config& cfg, const std::string& origin) {
  const auto& m = cfg.model;
  const auto& t = cfg.train;
  if (t.precision != "fp32" && t.precision != "bf16")
    fail(origin, ": field precision: unknown value '", t.precision, "' (known: fp32, bf16)");
  if (t.train_only != "all" && t.train_only != "tables")
    fail(origin, ": field train_only: unknown value '", t.train_only, "' (known: all, tables)");
  if (t.train_only == "tables" && !m.jtok && !m.jtokm)
    fail(origin, ": field train_only is 'tables' but the model has no token-indexed tables (jtok and jtokm are "
         "false): attach some with --jtok true or --jtokm true");
  if (t.table_learning_rate >= 0 && !(t.learning_rate > 0))
    fail(origin, ": field table_learning_rate (", t.table_learning_rate, ") needs a positive learning_rate (it scales "
         "learning_rate's schedule), got ", t.learning_rate);
  if (t.table_optimizer != "dense" && t.table_optimizer != "sparse" && t.table_optimizer != "dense-eager")
    fail(origin, ": field table_optimizer: unknown value '", t.table_optimizer, "' (known: dense, sparse, dense-eager)");
  positive(origin, "seq_len", t.seq_len);
  if (t.seq_len > m.max_position_embeddings)
    fail(origin, ": field seq_len (", t.seq_len, ") exceeds max_position_embeddings (", m.max_position_embeddings, ")");
  positive(origin, "micro_batch_size", t.micro_batch_size);
  positive(origin, "gradient_accumulation_steps", t.gradient_accumulation_steps);
  positive(origin, "max_steps", t.max_steps);
  nonneg(origin, "learning_rate", t.learning_rate);
  nonneg(origin, "min_lr", t.min_lr);
  if (t.lr_scheduler_type != "cosine" && t.lr_scheduler_type != "wsd" && t.lr_scheduler_type != "constant")
    fail(origin, ": field lr_scheduler_type: expected cosine, wsd or constant, got '", t.lr_scheduler_type, "'");
  if (!(t.warmup_ratio >= 0 && t.warmup_ratio <= 1)) fail(origin, ": field warmup_ratio must be in [0, 1], got ", t.warmup_ratio);
  if (!(t.decay_ratio >= 0 && t.decay_ratio <= 1)) fail(origin, ": field decay_ratio must be in [0, 1], got ", t.decay_ratio);
  nonneg(origin, "weight_decay", t.weight_decay);
  if (!(t.adam_beta1 >= 0 && t.adam_beta1 < 1)) fail(origin, ": field adam_beta1 must be in [0, 1), got ", t.adam_beta1);
  if (!(t.adam_beta2 >= 0 && t.adam_beta2 < 1)) fail(origin, ": field adam_beta2 must be in [0, 1), got ", t.adam_beta2);
  positive(origin, "adam_epsilon", t.adam_epsilon);
  positive(origin, "eval_interval", t.eval_interval);
  nonneg(origin, "eval_batches", t.eval_batches);  // 0: the whole validation set
  positive(origin, "checkpoint_interval", t.checkpoint_interval);
  positive(origin, "keep_checkpoints", t.keep_checkpoints);
  nonneg(origin, "sample_interval", t.sample_interval);
  positive(origin, "log_interval", t.log_interval);
}

void validate(const Config& cfg, const std::string& origin) {
  validate_backbone(cfg.model, origin);
  validate_token_modules_and_moe(cfg.model, origin);
  validate_training(cfg, origin);
}

Config config_from_json(const nlohmann::json& j, const std::string& origin, bool check) {
  if (!j.is_object()) fail(origin, ": expected a JSON object at the top level");
  Config cfg;
  const auto& s = schema();
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key().size() && it.key()[0] == '_') continue;  // "_comment" and the like
    auto f = s.find(it.key());
    if (f == s.end()) fail(origin, ": unknown field '", it.key(), "'");
    f->second.read(cfg, it.value(), origin + ": field " + it.key());
  }
  if (check) validate(cfg, origin);
  return cfg;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) fail("cannot read config file ", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("config file ", path, " is not valid JSON: ", e.what());
  }
  Config cfg = config_from_json(j, path, /*check=*/false);
  for (auto& o : overrides) {
    auto eq = o.find('=');
    if (eq == std::string::npos) fail("override expects name=value, got '", o, "'");
    apply_override(cfg, o.substr(0, eq), o.substr(eq + 1));
  }
  validate(cfg, overrides.empty() ? path : path + " (with command-line overrides)");
  return cfg;
}

void apply_override(Config& cfg, const std::string& name, const std::string& value) {
  const auto& s = schema();
  auto f = s.find(name);
  if (f == s.end()) fail("unknown config field '", name, "' on the command line");
  f->second.parse(cfg, value, "command line --" + name);
}

// Whether field f of cfg is written: every field but a variant's at its default.
static bool written(const Field& f, const Config& cfg) {
  static const Config defaults;
  return !f.variant || f.write(cfg) != f.write(defaults);
}

nlohmann::json to_json(const Config& cfg) {
  nlohmann::json j;
  for (auto& [k, f] : schema())
    if (written(f, cfg)) j[k] = f.write(cfg);
  return j;
}

std::vector<FieldDiff> model_fields_differing(const ModelConfig& a, const ModelConfig& b) {
  Config ca, cb;
  ca.model = a;
  cb.model = b;
  std::vector<FieldDiff> out;
  for (auto& [k, f] : schema())
    if (f.is_model && f.write(ca) != f.write(cb)) out.push_back({k, f.write(ca).dump(), f.write(cb).dump()});
  return out;
}

nlohmann::json to_json(const ModelConfig& m) {
  Config c;
  c.model = m;
  nlohmann::json out;
  for (auto& [k, f] : schema())
    if (f.is_model && written(f, c)) out[k] = f.write(c);
  return out;
}

}  // namespace jtok
