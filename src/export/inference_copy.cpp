#include "export/inference_copy.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "export/fold.h"
#include "io/safetensors.h"
#include "model/lowp_weights.h"
#include "model/weights_io.h"

namespace fs = std::filesystem;

namespace jtok {

void refuse_lowp_source(const Model& m, const std::string& origin) {
  if (m.lowp.any())
    fail("export: ", origin, " holds ", dtype_name(m.lowp.dtype), " weights (itself an export); export from the fp32 ",
         "checkpoint it came from");
}

int64_t prepare_export_model(Model& m, ModelConfig& cfg, const std::string& origin, const InferenceCopyOptions& opt) {
  for (const auto& t : m.tables)
    if (t.dtype() != Dtype::f32)
      fail("export: ", origin, " already has ", dtype_name(t.dtype()), " tables; export from the f32 checkpoint");
  int64_t folded = 0;
  if (opt.fold_jtok) {
    if (!cfg.jtok) fail("--fold-jtok: the model in ", origin, " has no JTok layers");
    folded = fold_jtok(m);
    cfg = m.cfg;  // jtok_norm = false now
  }
  // bf16 / int8 / int4 (symmetric, per-row scale) tables, JTok's (folded or not) and JTok-M's alike.
  if (opt.table_dtype != Dtype::f32)
    for (auto& t : m.tables) t = quantize_table(t, opt.table_dtype);
  return folded;
}

namespace {

// trainer_state.json: where the copy came from and how it was made; an imported model's eos ids.
nlohmann::json export_state(const std::string& origin, const std::vector<int32_t>& eos_ids, const InferenceCopyOptions& opt) {
  nlohmann::json state = {{"exported_from", origin}, {"fold_jtok", opt.fold_jtok},
                          {"table_dtype", dtype_name(opt.table_dtype)}, {"weight_dtype", dtype_name(opt.weight_dtype)}};
  if (fs::exists(fs::path(origin) / "tokenizer.json")) state["eos_token_ids"] = eos_ids;
  return state;
}

// An imported model's own tokenizer files go along (its tokenizer.json marks it as one).
void copy_tokenizer_files(const std::string& origin, const fs::path& to) {
  if (!fs::exists(fs::path(origin) / "tokenizer.json")) return;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"})
    if (fs::exists(fs::path(origin) / name))
      write_file_atomic((to / name).string(), read_file((fs::path(origin) / name).string()));
}

}  // namespace

void write_inference_copy(const Model& m, const Config& cfg, const std::string& origin, const std::vector<int32_t>& eos_ids,
                          const std::string& out, const InferenceCopyOptions& opt) {
  StFile st = weights_to_st(m);
  convert_to_lowp(st, cfg.model, opt.weight_dtype);  // f32: unchanged
  st.metadata["format"] = "pt";
  publish_dir_atomic(out, [&](const std::string& tmp_dir) {
    const fs::path tmp(tmp_dir);
    write_safetensors((tmp / "model.safetensors").string(), st);
    write_file_atomic((tmp / "config.json").string(), to_json(cfg).dump(2) + "\n");
    copy_tokenizer_files(origin, tmp);
    write_file_atomic((tmp / "trainer_state.json").string(), export_state(origin, eos_ids, opt).dump(2) + "\n");
    write_file_atomic((tmp / "COMPLETE").string(), "export\n");  // inside: the directory appears complete
  });
}

TableStoreSource checkpoint_source(const std::string& dir) {
  TableStoreSource s;
  s.checkpoint = dir_basename(dir);
  const fs::path state = fs::path(dir) / "trainer_state.json";
  if (fs::exists(state)) {
    const nlohmann::json j = nlohmann::json::parse(read_file(state.string()), nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer()) s.step = j["step"].get<int64_t>();
  }
  return s;
}

}  // namespace jtok
