#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <tuple>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "io/safetensors.h"
#include "model/weights_io.h"
#include "train/disk_tables.h"

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
  for (size_t i = 0; i < m.layout.size(); ++i) {
    const ParamInfo& p = m.layout[i];
    const size_t n = static_cast<size_t>(p.numel);
    if (bad(m.params.data() + p.offset, n)) return p.name;
    const int64_t mo = opt.moment_offset.at(i);  // < 0: frozen, no moments
    if (mo >= 0 && (bad(opt.m.data() + mo, n) || bad(opt.v.data() + mo, n))) return "the AdamW moments of " + p.name;
  }
  for (size_t k = 0; k < m.tables.size(); ++k) {
    if (m.tables[k].trained_in_store()) continue;  // rows on disk are not scanned (a non-finite step is never applied)
    if (bad(m.tables[k].data(), static_cast<size_t>(m.tables[k].numel()))) return m.table_names[k];
    if (bad(opt.tables.m[k].data(), opt.tables.m[k].size()) || bad(opt.tables.v[k].data(), opt.tables.v[k].size()))
      return "the AdamW moments of " + m.table_names[k];
  }
  return "";
}

namespace {

struct CkptPaths {
  fs::path root, final_dir, tmp;
};

// A checkpoint's paths; refuses to replace another run's complete checkpoint of the same step.
CkptPaths checkpoint_paths(const std::string& run_dir, int64_t step, const std::string& run_id) {
  CkptPaths p;
  p.root = fs::path(run_dir) / "checkpoints";
  p.final_dir = p.root / checkpoint_dir_name(step);
  p.tmp = p.root / (checkpoint_dir_name(step) + ".tmp");
  if (is_complete(p.final_dir) && run_id_of(p.final_dir) != run_id)
    fail("checkpoint ", p.final_dir.string(), " belongs to another run (run id '", run_id_of(p.final_dir),
         "'); not overwriting it");
  return p;
}
// Its fresh temp directory.
void make_tmp(const CkptPaths& p) {
  fs::create_directories(p.root);
  fs::remove_all(p.tmp);
  fs::create_directories(p.tmp);
}

// The optimizer file's backbone part: exp_avg.* and exp_avg_sq.* of the flat parameters that train
// (a frozen tensor has none: --train-only tables).
StFile backbone_moments_st(const Model& m, const AdamWState& opt) {
  StFile f;
  for (auto* part : {&opt.m, &opt.v}) {
    const char* prefix = part == &opt.m ? "exp_avg." : "exp_avg_sq.";
    for (auto& [k, t] : flat_to_st(m, *part, prefix, opt.moment_offset).tensors) f.tensors[k] = t;
  }
  f.metadata["step"] = std::to_string(opt.step);
  return f;
}

// The small files, the rename and the COMPLETE marker last; then retention (rank 0 only).
std::string commit_checkpoint(const CkptPaths& p, int64_t step, const Config& cfg, const nlohmann::json& trainer_state,
                              const std::string& run_id, int64_t keep_last) {
  write_file_atomic((p.tmp / "trainer_state.json").string(), trainer_state.dump(2) + "\n");
  write_file_atomic((p.tmp / "config.json").string(), to_json(cfg).dump(2) + "\n");
  fsync_dir(p.tmp.string());

  if (fs::exists(p.final_dir)) fs::remove_all(p.final_dir);  // a stale incomplete one of the same step, or this run's own
  std::error_code ec;
  fs::rename(p.tmp, p.final_dir, ec);
  if (ec) fail("cannot rename checkpoint ", p.tmp.string(), " to ", p.final_dir.string(), ": ", ec.message());
  try {
    fsync_dir(p.root.string());
    write_file_atomic((p.final_dir / "COMPLETE").string(), std::to_string(step) + "\n");
  } catch (...) {
    // Not marked complete (or not durably): nothing of it stays under the final name; the previous
    // checkpoint is still the newest complete one (retention below has not run).
    fs::remove_all(p.final_dir, ec);
    throw;
  }

  // Keep this run's newest keep_last complete checkpoints (another run's are never touched; the
  // one just written is complete before any is deleted); drop leftovers of interrupted writes.
  std::vector<fs::path> ours;
  for (auto& c : complete_checkpoints(p.root))
    if (run_id_of(c) == run_id) ours.push_back(c);
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < ours.size(); ++i) fs::remove_all(ours[i]);
  for (auto& e : fs::directory_iterator(p.root)) {
    auto name = e.path().filename().string();
    if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp") fs::remove_all(e.path());
  }
  return p.final_dir.string();
}

int open_or_fail(const fs::path& path, int flags) {
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) fail("cannot open ", path.string(), ": ", std::strerror(errno));
  return fd;
}
void pwrite_all(int fd, const fs::path& path, const void* data, size_t n, uint64_t off) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("writing ", path.string(), " at byte ", off, ": ", w < 0 ? std::strerror(errno) : "no progress");
    p += w, n -= static_cast<size_t>(w), off += static_cast<uint64_t>(w);
  }
}
void fsync_close(int fd, const fs::path& path) {
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    fail("fsync ", path.string(), ": ", std::strerror(e));
  }
  if (::close(fd) != 0) fail("close ", path.string(), ": ", std::strerror(errno));
}

}  // namespace

std::string save_checkpoint(const std::string& run_dir, int64_t step, const Config& cfg, const Model& m,
                            const AdamWState& opt, const nlohmann::json& trainer_state, int64_t keep_last) {
  const TrainTableStore* store = m.tables.empty() ? nullptr : train_store_of(m.tables[0].disk_rows()).store;
  JTOK_CHECK(store || opt.tables.consts.empty(), "save_checkpoint: table rows have deferred AdamW steps; call sync_tables first");
  const std::string run_id = trainer_state.value("run_id", std::string());
  JTOK_CHECK(!run_id.empty(), "save_checkpoint: trainer_state has no run_id");
  const CkptPaths p = checkpoint_paths(run_dir, step, run_id);
  const std::string nonfinite = first_nonfinite(m, opt);
  if (!nonfinite.empty()) fail("not writing checkpoint ", p.final_dir.string(), ": ", nonfinite, " holds a NaN or an infinity");
  make_tmp(p);

  StFile model_st = weights_to_st(m);
  model_st.metadata["format"] = "pt";  // as Hugging Face writes it
  write_safetensors((p.tmp / "model.safetensors").string(), model_st);
  StFile opt_st = backbone_moments_st(m, opt);
  if (store) {  // the tables, their moments and steps are in the store (flushed by the caller)
    write_file_atomic((p.tmp / "table_store.json").string(), kept_steps_json(store->dir(), opt.tables).dump(1) + "\n");
  } else {
    for (auto& [k, t] : tables_to_st(m, opt.tables.m, "exp_avg.").tensors) opt_st.tensors[k] = t;
    for (auto& [k, t] : tables_to_st(m, opt.tables.v, "exp_avg_sq.").tensors) opt_st.tensors[k] = t;
  }
  write_safetensors((p.tmp / "optimizer.safetensors").string(), opt_st);
  return commit_checkpoint(p, step, cfg, trainer_state, run_id, keep_last);
}

namespace {

// Non-finite values anywhere (backbone, or any rank's rows) stop every rank before a byte is written.
void check_sharded_finite(const Model& m, const AdamWState& opt, const std::vector<TableRows>& mine, const fs::path& dir) {
  std::string bad = first_nonfinite(m, opt);
  for (size_t k = 0; bad.empty() && k < mine.size(); ++k) {
    const TableRows& t = mine[k];
    const int64_t n = t.rows * t.dim;
    for (const float* a : {t.w, t.m, t.v})
      for (int64_t i = 0; i < n && bad.empty(); ++i)
        if (!std::isfinite(a[i])) bad = (a == t.w ? "" : "the AdamW moments of ") + m.table_names[k];
  }
  double any_bad = bad.empty() ? 0.0 : 1.0;
  dist::allreduce_max(&any_bad, 1);
  if (any_bad > 0)
    fail("not writing checkpoint ", dir.string(), ": ", bad.empty() ? std::string("another rank's rows") : bad,
         " hold a NaN or an infinity");
}

// Both files' layouts, the very ones write_safetensors gives the gathered tensors (the shapes of
// flat_to_st's and backbone_moments_st's tensors).
struct ShardedLayouts {
  std::map<std::string, std::string> model_meta, opt_meta;
  StLayout model, opt;
};
ShardedLayouts sharded_layouts(const Model& m, const AdamWState& opt, const std::vector<TableRows>& mine) {
  ShardedLayouts L;
  L.model_meta = {{"format", "pt"}};
  L.opt_meta = {{"step", std::to_string(opt.step)}};
  std::map<std::string, StShape> model_shapes, opt_shapes;
  for (size_t i = 0; i < m.layout.size(); ++i) {
    const ParamInfo& p = m.layout[i];
    model_shapes[p.name] = {"F32", p.shape};
    if (opt.moment_offset.at(i) < 0) continue;  // frozen: no moments
    opt_shapes["exp_avg." + p.name] = {"F32", p.shape};
    opt_shapes["exp_avg_sq." + p.name] = {"F32", p.shape};
  }
  for (size_t k = 0; k < mine.size(); ++k) {
    const std::vector<int64_t> shape = {mine[k].V, mine[k].dim};
    model_shapes[m.table_names[k]] = {"F32", shape};
    opt_shapes["exp_avg." + m.table_names[k]] = {"F32", shape};
    opt_shapes["exp_avg_sq." + m.table_names[k]] = {"F32", shape};
  }
  L.model = safetensors_layout(model_shapes, L.model_meta);
  L.opt = safetensors_layout(opt_shapes, L.opt_meta);
  return L;
}

// Rank 0: both files pre-sized (ftruncate: holes until the ranks write), header and backbone in place.
void write_sharded_heads(const CkptPaths& paths, const Model& m, const AdamWState& opt, const ShardedLayouts& L) {
  make_tmp(paths);
  StFile model_bb = flat_to_st(m, m.params, "");
  model_bb.metadata = L.model_meta;
  StFile opt_bb = backbone_moments_st(m, opt);
  JTOK_CHECK(opt_bb.metadata == L.opt_meta && model_bb.tensors.size() == m.layout.size(), "checkpoint layout");
  for (auto [name, lay, st] : {std::tuple{"model.safetensors", &L.model, &model_bb}, std::tuple{"optimizer.safetensors", &L.opt, &opt_bb}}) {
    const fs::path f = paths.tmp / name;
    const int fd = open_or_fail(f, O_WRONLY | O_CREAT | O_TRUNC);
    if (::ftruncate(fd, static_cast<off_t>(lay->size)) != 0) fail("ftruncate ", f.string(), ": ", std::strerror(errno));
    pwrite_all(fd, f, lay->head.data(), lay->head.size(), 0);
    for (auto& [k, t] : st->tensors) pwrite_all(fd, f, t.bytes.data(), t.bytes.size(), lay->offset.at(k));
    fsync_close(fd, f);
  }
}

// Every rank: its rows (values and moments) at their offsets, runs of consecutive global rows in one write.
void write_owned_rows(const fs::path& tmp, const Model& m, const std::vector<TableRows>& mine, const ShardedLayouts& L) {
  const fs::path mf = tmp / "model.safetensors", of = tmp / "optimizer.safetensors";
  const int mfd = open_or_fail(mf, O_WRONLY), ofd = open_or_fail(of, O_WRONLY);
  for (size_t k = 0; k < mine.size(); ++k) {
    const TableRows& t = mine[k];
    const uint64_t row_bytes = static_cast<uint64_t>(t.dim) * sizeof(float);
    const std::string& name = m.table_names[k];
    const struct { int fd; const fs::path* path; uint64_t base; const float* src; } parts[3] = {
        {mfd, &mf, L.model.offset.at(name), t.w},
        {ofd, &of, L.opt.offset.at("exp_avg." + name), t.m},
        {ofd, &of, L.opt.offset.at("exp_avg_sq." + name), t.v}};
    for (int64_t r = 0; r < t.rows;) {
      const int64_t g = t.global(r);
      int64_t n = 1;
      while (r + n < t.rows && t.global(r + n) == g + n) ++n;
      for (const auto& part : parts)
        pwrite_all(part.fd, *part.path, part.src + r * t.dim, n * row_bytes, part.base + static_cast<uint64_t>(g) * row_bytes);
      r += n;
    }
  }
  fsync_close(mfd, mf);
  fsync_close(ofd, of);
}

}  // namespace

std::string save_checkpoint_sharded(const std::string& run_dir, int64_t step, const Config& cfg, const Model& m,
                                    const AdamWState& opt, const nlohmann::json& trainer_state, int64_t keep_last,
                                    const std::vector<TableRows>& mine) {
  JTOK_CHECK(opt.tables.consts.empty(), "save_checkpoint_sharded: deferred AdamW steps pending");
  JTOK_CHECK(mine.size() == m.tables.size(), "save_checkpoint_sharded: ", mine.size(), " shards for ", m.tables.size(), " tables");
  const std::string run_id = trainer_state.value("run_id", std::string());
  JTOK_CHECK(!run_id.empty(), "save_checkpoint_sharded: trainer_state has no run_id");
  const bool lead = dist::rank() == 0;
  const CkptPaths paths = lead ? checkpoint_paths(run_dir, step, run_id) : CkptPaths{};
  const fs::path dir = fs::path(run_dir) / "checkpoints" / checkpoint_dir_name(step);
  check_sharded_finite(m, opt, mine, dir);
  const ShardedLayouts L = sharded_layouts(m, opt, mine);
  if (lead) write_sharded_heads(paths, m, opt, L);
  dist::barrier();
  write_owned_rows(fs::path(run_dir) / "checkpoints" / (checkpoint_dir_name(step) + ".tmp"), m, mine, L);
  dist::barrier();  // every rank's rows are on disk
  std::string out = dir.string();
  if (lead) out = commit_checkpoint(paths, step, cfg, trainer_state, run_id, keep_last);
  return out;
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

nlohmann::json load_checkpoint(const std::string& ckpt_dir, Model& m, AdamWState* opt, bool tables) {
  const fs::path d(ckpt_dir);
  if (!is_complete(d)) fail("checkpoint ", ckpt_dir, " is incomplete (no COMPLETE marker): it was interrupted while being written");
  const std::string mp = (d / "model.safetensors").string();
  const StIndex mi = read_safetensors_index(mp);
  const bool in_store = fs::exists(d / "table_store.json");  // tables in a training store (disk_tables.h)
  if (in_store && tables)
    fail("checkpoint ", ckpt_dir, " keeps its token tables in a training table store (table_store.json names it), not in ",
         "model.safetensors: resume it with --tables disk --table-store DIR");
  if (opt && !in_store)  // training: every table must be f32 (bf16 / int8 / int4 ones are inference exports)
    for (size_t k = 0; k < m.tables.size(); ++k)
      if (Dtype dt = table_dtype_in_file(mi, m.table_names[k], m.tables[k].rows, m.tables[k].dim); dt != Dtype::f32)
        fail(mp, ": token table ", m.table_names[k], " is stored as ", dtype_name(dt),
             " (an inference export, jtok export --table-dtype); training needs f32 tables: train from the f32 checkpoint it was exported from");
  load_weights(m, mi, tables, !in_store);  // streamed: one tensor at a time into m
  if (opt && m.lowp.any())
    fail(mp, " holds ", dtype_name(m.lowp.dtype), " weights (a `jtok export --weight-dtype` inference copy): ",
         "it can be evaluated, generated from and served, not trained or resumed");
  if (opt) {
    const std::string op = (d / "optimizer.safetensors").string();
    const StIndex f = read_safetensors_index(op);
    *opt = make_adamw_state(m, tables);
    for (size_t i = 0; i < m.layout.size(); ++i) {  // the trainable tensors' (m.backbone_frozen: the modules')
      const ParamInfo& p = m.layout[i];
      const int64_t mo = opt->moment_offset[i];
      if (mo < 0) continue;
      read_tensor_f32(f, "exp_avg." + p.name, p.shape, opt->m.data() + mo);
      read_tensor_f32(f, "exp_avg_sq." + p.name, p.shape, opt->v.data() + mo);
    }
    for (size_t k = 0; tables && k < m.tables.size(); ++k) {
      const auto& t = m.tables[k];
      read_tensor_f32(f, "exp_avg." + m.table_names[k], {t.rows, t.dim}, opt->tables.m[k].data());
      read_tensor_f32(f, "exp_avg_sq." + m.table_names[k], {t.rows, t.dim}, opt->tables.v[k].data());
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
  } catch (const nlohmann::json::exception& e) {
    fail(sp, " is not valid JSON: ", e.what());
  }
}

}  // namespace jtok
