#include "train/checkpoint.h"

#include <algorithm>
#include <cmath>
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

// The run id a checkpoint's trainer_state.json names ("" for one without, or unreadable).
static std::string run_id_of(const fs::path& ckpt) {
  try {
    auto j = nlohmann::json::parse(read_file((ckpt / "trainer_state.json").string()));
    if (j.contains("run_id") && j["run_id"].is_string()) return j["run_id"].get<std::string>();
  } catch (const std::exception&) {
  }
  return "";
}

// The first tensor holding a NaN or an infinity ("" if none): a checkpoint is never written with one.
static std::string first_nonfinite(const Model& m, const AdamWState& opt) {
  auto bad = [](const float* x, size_t n) {
    int any = 0;
#pragma omp parallel for reduction(| : any) schedule(static)
    for (size_t i = 0; i < n; ++i) any |= !std::isfinite(x[i]);
    return any != 0;
  };
  for (const auto& p : m.layout) {
    const size_t o = static_cast<size_t>(p.offset), n = static_cast<size_t>(p.numel);
    if (bad(m.params.data() + o, n)) return p.name;
    if (bad(opt.m.data() + o, n) || bad(opt.v.data() + o, n)) return "the AdamW moments of " + p.name;
  }
  for (size_t k = 0; k < m.tables.size(); ++k) {
    if (bad(m.tables[k].data(), static_cast<size_t>(m.tables[k].numel()))) return m.table_names[k];
    if (bad(opt.table_m[k].data(), opt.table_m[k].size()) || bad(opt.table_v[k].data(), opt.table_v[k].size()))
      return "the AdamW moments of " + m.table_names[k];
  }
  return "";
}

std::string save_checkpoint(const std::string& run_dir, int64_t step, const Config& cfg, const Model& m,
                            const AdamWState& opt, const nlohmann::json& trainer_state, int64_t keep_last) {
  JTOK_CHECK(opt.table_consts.empty(), "save_checkpoint: table rows have deferred AdamW steps; call sync_tables first");
  const std::string run_id = trainer_state.value("run_id", std::string());
  JTOK_CHECK(!run_id.empty(), "save_checkpoint: trainer_state has no run_id");
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const fs::path final_dir = root / checkpoint_dir_name(step);
  if (is_complete(final_dir) && run_id_of(final_dir) != run_id)
    fail("checkpoint ", final_dir.string(), " belongs to another run (run id '", run_id_of(final_dir),
         "'); not overwriting it");
  const std::string nonfinite = first_nonfinite(m, opt);
  if (!nonfinite.empty())
    fail("not writing checkpoint ", final_dir.string(), ": ", nonfinite, " holds a NaN or an infinity");
  fs::create_directories(root);
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

  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a stale incomplete one of the same step, or this run's own
  fs::rename(tmp, final_dir);
  fsync_dir(root.string());
  write_file_atomic((final_dir / "COMPLETE").string(), std::to_string(step) + "\n");

  // Keep this run's newest keep_last complete checkpoints (another run's are never touched; the
  // one just written is complete before any is deleted); drop leftovers of interrupted writes.
  std::vector<fs::path> ours;
  for (auto& c : complete_checkpoints(root))
    if (run_id_of(c) == run_id) ours.push_back(c);
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < ours.size(); ++i) fs::remove_all(ours[i]);
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

void load_checkpoint_mapped(const std::string& ckpt_dir, Model& m) {
  const fs::path d(ckpt_dir);
  if (!is_complete(d)) fail("checkpoint ", ckpt_dir, " is incomplete (no COMPLETE marker): it was interrupted while being written");
  load_weights_mapped(m, MappedFile::open((d / "model.safetensors").string()));
}

nlohmann::json load_checkpoint(const std::string& ckpt_dir, Model& m, AdamWState* opt) {
  const fs::path d(ckpt_dir);
  if (!is_complete(d)) fail("checkpoint ", ckpt_dir, " is incomplete (no COMPLETE marker): it was interrupted while being written");
  const std::string mp = (d / "model.safetensors").string();
  const StIndex mi = read_safetensors_index(mp);
  if (opt)  // training: every table must be f32 (bf16 / int8 ones are inference exports)
    for (size_t k = 0; k < m.tables.size(); ++k)
      if (TableDtype dt = table_dtype_in_file(mi, m.table_names[k], m.tables[k].rows, m.tables[k].dim); dt != TableDtype::F32)
        fail(mp, ": token table ", m.table_names[k], " is stored as ", table_dtype_name(dt),
             " (an inference export, jtok export --table-dtype); training needs f32 tables: train from the f32 checkpoint it was exported from");
  load_weights(m, mi);  // streamed: one tensor at a time into m
  if (opt && m.lowp.any())
    fail(mp, " holds ", weight_dtype_name(m.lowp.dtype), " weights (a `jtok export --weight-dtype` inference copy): ",
         "it can be evaluated, generated from and served, not trained or resumed");
  if (opt) {
    const std::string op = (d / "optimizer.safetensors").string();
    const StIndex f = read_safetensors_index(op);
    *opt = make_adamw_state(m);
    for (const auto& p : m.layout) {
      read_tensor_f32(f, "exp_avg." + p.name, p.shape, opt->m.data() + p.offset);
      read_tensor_f32(f, "exp_avg_sq." + p.name, p.shape, opt->v.data() + p.offset);
    }
    for (size_t k = 0; k < m.tables.size(); ++k) {
      const auto& t = m.tables[k];
      read_tensor_f32(f, "exp_avg." + m.table_names[k], {t.rows, t.dim}, opt->table_m[k].data());
      read_tensor_f32(f, "exp_avg_sq." + m.table_names[k], {t.rows, t.dim}, opt->table_v[k].data());
    }
    auto st = f.metadata.find("step");
    if (st == f.metadata.end()) fail(op, ": no optimizer step in the metadata");
    try {
      opt->step = std::stoll(st->second);
    } catch (const std::exception&) {
      fail(op, ": optimizer step '", st->second, "' in the metadata is not a number");
    }
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
