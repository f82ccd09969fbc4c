#include "run_setup.h"

#include <filesystem>

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

LoadedCheckpoint load_for_inference(const std::string& checkpoint_or_run, bool map_tables) {
  const std::string dir = resolve_checkpoint(checkpoint_or_run);
  Config cfg = load_checkpoint_config(dir);
  // Every value comes from the file; with map_tables the tables get no storage of their own.
  Model m = make_model(cfg.model, 0, {.init = false, .grads = false, .tables = !map_tables});
  if (map_tables) load_checkpoint_mapped(dir, m);
  else load_checkpoint(dir, m, nullptr);
  Tokenizer tok = Tokenizer::load(cfg.train.tokenizer, cfg.train.tokenizer_dir);
  return {dir, cfg, std::move(m), std::move(tok)};
}

}  // namespace jtok
