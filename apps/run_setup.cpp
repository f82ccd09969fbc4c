#include "run_setup.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "train/checkpoint.h"

namespace jtok {

std::map<std::string, std::string>& add_config_field_options(CLI::App* sub) {
  static std::map<std::string, std::string> values;  // one command runs per process
  auto* group = sub->add_option_group("config fields", "any config field, overriding the file (--name value)");
  for (const auto& name : config_field_names()) group->add_option("--" + name, values[name], "");
  return values;
}

std::vector<std::string> collect_overrides(CLI::App* sub, const std::map<std::string, std::string>& fields,
                                           const std::vector<std::string>& sets) {
  std::vector<std::string> out;
  for (const auto& [name, value] : fields)
    if (sub->get_option_group("config fields")->count("--" + name) > 0) out.push_back(name + "=" + value);
  for (const auto& s : sets) out.push_back(s);
  return out;
}

std::string resolve_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) fail("checkpoint ", path, " does not exist");
  if (fs::exists(fs::path(path) / "config.json")) return path;
  if (fs::exists(fs::path(path) / "model.safetensors") && !fs::exists(fs::path(path) / "COMPLETE"))
    fail("checkpoint ", path, " is incomplete (no COMPLETE marker): it was interrupted while being written");
  if (auto latest = latest_checkpoint(path)) return *latest;
  fail(path, " is neither a checkpoint directory (no config.json) nor a run directory with a complete checkpoint");
}

// trainer_state.json's eos_token_ids (written by `jtok import`), those within the vocabulary; empty
// when it has none (a trained checkpoint) or cannot be read.
static std::vector<int32_t> checkpoint_eos_ids(const std::string& dir, int64_t vocab) {
  std::vector<int32_t> ids;
  try {
    const auto j = nlohmann::json::parse(read_file((std::filesystem::path(dir) / "trainer_state.json").string()));
    if (j.is_object() && j.contains("eos_token_ids") && j["eos_token_ids"].is_array())
      for (const auto& v : j["eos_token_ids"])
        if (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab) ids.push_back(v.get<int32_t>());
  } catch (const std::exception&) {
  }
  return ids;
}

LoadedCheckpoint load_for_inference(const std::string& checkpoint_or_run, bool map_tables) {
  const std::string dir = resolve_checkpoint(checkpoint_or_run);
  Config cfg = load_checkpoint_config(dir);
  // Every value comes from the file; with map_tables the tables get no storage of their own.
  Model m = make_model(cfg.model, 0, {.init = false, .grads = false, .tables = !map_tables});
  if (map_tables) load_checkpoint_mapped(dir, m);
  else load_checkpoint(dir, m, nullptr);
  // A checkpoint holding its own tokenizer.json (an import) reads it there, wherever the checkpoint
  // has been moved since (its config's tokenizer_dir names where it was written).
  const bool own = cfg.train.tokenizer != "gpt2" && std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json");
  Tokenizer tok = Tokenizer::load(cfg.train.tokenizer, own ? dir : cfg.train.tokenizer_dir);
  std::vector<int32_t> eos = checkpoint_eos_ids(dir, cfg.model.vocab_size);
  if (eos.empty()) eos.push_back(tok.eot_id());
  return {dir, cfg, std::move(m), std::move(tok), std::move(eos)};
}

}  // namespace jtok
