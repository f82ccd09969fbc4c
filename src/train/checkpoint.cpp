#include "train/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/weights_io.h"

namespace fs = std::filesystem;

namespace jtok {

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

static bool is_complete(const fs::path& d) { return fs::exists(d / "COMPLETE"); }

// Complete checkpoint directories, oldest first (names sort by step: zero-padded).
static std::vector<fs::path> complete_checkpoints(const fs::path& root) {
  std::vector<fs::path> out;
  if (!fs::is_directory(root)) return out;
  for (auto& e : fs::directory_iterator(root)) {
    auto name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step_", 0) == 0 && name.find(".tmp") == std::string::npos && is_complete(e.path()))
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string save_checkpoint(const std::string& run_dir, int64_t step, const Config& cfg, const Model& m,
                            const AdamWState& opt, const nlohmann::json& trainer_state, int64_t keep_last) {
  JTOK_CHECK(opt.table_consts.empty(), "save_checkpoint: table rows have deferred AdamW steps; call sync_tables first");
  const fs::path root = fs::path(run_dir) / "checkpoints";
  fs::create_directories(root);
  const fs::path final_dir = root / checkpoint_dir_name(step);
  const fs::path tmp = root / (checkpoint_dir_name(step) + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);

  StFile model_st = weights_to_st(m);
  model_st.metadata["format"] = "pt";  // as Hugging Face writes it
  write_safetensors((tmp / "model.safetensors").string(), model_st);
  StFile opt_st;
  for (auto* part : {&opt.m, &opt.v}) {
    const char* prefix = part == &opt.m ? "exp_avg." : "exp_avg_sq.";
    for (auto& [k, t] : flat_to_st(m, *part, prefix).tensors) opt_st.tensors[k] = t;
  }
  for (auto& [k, t] : tables_to_st(m, opt.table_m, "exp_avg.").tensors) opt_st.tensors[k] = t;
  for (auto& [k, t] : tables_to_st(m, opt.table_v, "exp_avg_sq.").tensors) opt_st.tensors[k] = t;
  opt_st.metadata["step"] = std::to_string(opt.step);
  write_safetensors((tmp / "optimizer.safetensors").string(), opt_st);
  write_file_atomic((tmp / "trainer_state.json").string(), trainer_state.dump(2) + "\n");
  write_file_atomic((tmp / "config.json").string(), to_json(cfg).dump(2) + "\n");
  fsync_dir(tmp.string());

  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a stale incomplete one of the same step
  fs::rename(tmp, final_dir);
  fsync_dir(root.string());
  write_file_atomic((final_dir / "COMPLETE").string(), std::to_string(step) + "\n");

  // Keep the newest keep_last complete checkpoints; drop leftovers of interrupted writes.
  auto all = complete_checkpoints(root);
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i) fs::remove_all(all[i]);
  for (auto& e : fs::directory_iterator(root)) {
    auto name = e.path().filename().string();
    if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp") fs::remove_all(e.path());
  }
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  auto all = complete_checkpoints(fs::path(run_dir) / "checkpoints");
  if (all.empty()) return std::nullopt;
  return all.back().string();
}

Config load_checkpoint_config(const std::string& ckpt_dir) {
  const std::string p = (fs::path(ckpt_dir) / "config.json").string();
  if (!fs::exists(p)) fail("checkpoint ", ckpt_dir, " has no config.json (not a checkpoint directory?)");
  return load_config(p);
}

nlohmann::json load_checkpoint(const std::string& ckpt_dir, Model& m, AdamWState* opt) {
  const fs::path d(ckpt_dir);
  if (!is_complete(d)) fail("checkpoint ", ckpt_dir, " is incomplete (no COMPLETE marker): it was interrupted while being written");
  const std::string mp = (d / "model.safetensors").string();
  load_weights(m, read_safetensors(mp), mp);
  if (opt) {
    const std::string op = (d / "optimizer.safetensors").string();
    StFile f = read_safetensors(op);
    *opt = make_adamw_state(m);
    for (const auto& p : m.layout) {
      copy_tensor(f, "exp_avg." + p.name, p.shape, opt->m.data() + p.offset, op);
      copy_tensor(f, "exp_avg_sq." + p.name, p.shape, opt->v.data() + p.offset, op);
    }
    for (size_t k = 0; k < m.tables.size(); ++k) {
      const auto& t = m.tables[k];
      copy_tensor(f, "exp_avg." + m.table_names[k], {t.rows, t.dim}, opt->table_m[k].data(), op);
      copy_tensor(f, "exp_avg_sq." + m.table_names[k], {t.rows, t.dim}, opt->table_v[k].data(), op);
    }
    auto st = f.metadata.find("step");
    if (st == f.metadata.end()) fail(op, ": no optimizer step in the metadata");
    opt->step = std::stoll(st->second);
    mark_tables_current(m, *opt);  // a checkpoint holds every table row current
  }
  const std::string sp = (d / "trainer_state.json").string();
  try {
    return nlohmann::json::parse(read_file(sp));
  } catch (const nlohmann::json::parse_error& e) {
    fail(sp, " is not valid JSON: ", e.what());
  }
}

}  // namespace jtok
