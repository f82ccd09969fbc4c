#include "hf/hf_import.h"

#include <filesystem>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "hf/hf_config.h"
#include "hf/hf_tokenizer.h"
#include "hf/hf_weights.h"
#include "hf/st_stream.h"
#include "model/transformer.h"

namespace jtok {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  return os.str() + ")";
}

// Tensors an HF file may hold that jtok recomputes (older Llama files store RoPE's inverse frequencies).
bool derived_buffer(const std::string& name) { return name.find("rotary_emb.inv_freq") != std::string::npos; }

// Every parameter of the model, checked present in the HF files with a float dtype and its shape;
// a tensor of the files that is neither a parameter nor a derived buffer is refused (config and
// weights disagree). A tied model's files may also hold lm_head.weight (a copy): it is not read.
std::vector<ParamInfo> checked_layout(const HfWeights& w, const ModelConfig& m, const std::string& config_path) {
  std::vector<ParamInfo> layout = param_layout(m);
  std::set<std::string> used;
  for (const ParamInfo& p : layout) {
    if (!w.has(p.name)) fail(w.source, ": missing tensor ", p.name, " (", config_path, " says the model has it)");
    const StEntry& e = w.entry(p.name);
    const std::string& file = w.file_of(p.name).path;
    if (!hf_float_dtype(e.dtype)) fail(file, ": tensor ", p.name, " has dtype ", e.dtype, " (expected BF16, F16 or F32)");
    if (e.shape != p.shape)
      fail(file, ": tensor ", p.name, " has shape ", shape_str(e.shape), ", ", config_path, " needs ", shape_str(p.shape));
    used.insert(p.name);
  }
  for (const auto& [name, file] : w.where) {
    if (used.count(name) || derived_buffer(name) || (m.tie_word_embeddings && name == "lm_head.weight")) continue;
    fail(w.files[file].path, ": unexpected tensor ", name, " (", config_path, " and the weights disagree?)");
  }
  return layout;
}

// model.safetensors of the checkpoint, tensor by tensor in file order, converted to f32 as it is
// read: the bytes write_safetensors would give the same f32 tensors. Returns the file's size.
uint64_t write_weights(const HfWeights& w, const std::vector<ParamInfo>& layout, const std::string& path,
                       const std::function<void(uint64_t, uint64_t)>& progress) {
  std::map<std::string, StShape> shapes;
  uint64_t total = 0, done = 0;
  for (const ParamInfo& p : layout) {
    shapes[p.name] = {"F32", p.shape};
    total += static_cast<uint64_t>(p.numel) * sizeof(float);
  }
  return write_safetensors_streamed(path, shapes, {{"format", "pt"}}, [&](const std::string& name, const auto& put) {
    stream_tensor_f32(w, name, [&](const float* v, int64_t n) {
      put(std::string_view(reinterpret_cast<const char*>(v), static_cast<size_t>(n) * sizeof(float)));
      done += static_cast<uint64_t>(n) * sizeof(float);
    });
    if (progress) progress(done, total);
  });
}

json read_json(const std::string& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    fail(path, " is not valid JSON: ", e.what());
  }
}

// The checkpoint's config.json: the model's fields and the training defaults, with the tokenizer
// set to the checkpoint's own copy (tokenizer_dir: the checkpoint directory, absolute).
Config checkpoint_config(const HfModelInfo& info, const std::string& tokenizer, const fs::path& out) {
  Config c;
  c.model = info.model;
  c.train.seq_len = std::min<int64_t>(c.train.seq_len, c.model.max_position_embeddings);
  if (!tokenizer.empty()) {
    c.train.tokenizer = tokenizer;
    c.train.tokenizer_dir = fs::absolute(out).lexically_normal().string();
  }
  validate(c, "the imported config");
  return c;
}

void write_checkpoint_files(const ImportOptions& opt, const HfModelInfo& info, const Config& cfg,
                            const std::vector<int64_t>& eos, const fs::path& tmp) {
  write_file_atomic((tmp / "config.json").string(), to_json(cfg).dump(2) + "\n");
  const json state = {{"step", 0},
                      {"imported_from", fs::absolute(opt.from).lexically_normal().string()},
                      {"hf_model_type", info.hf_model_type},
                      {"hf_max_position_embeddings", info.hf_max_position_embeddings},
                      {"eos_token_ids", eos}};
  write_file_atomic((tmp / "trainer_state.json").string(), state.dump(2) + "\n");
  for (const char* name : kHfSideFiles) {
    const fs::path src = fs::path(opt.from) / name;
    if (fs::exists(src) && (cfg.train.tokenizer_dir.size() || std::string(name) == "generation_config.json"))
      write_file_atomic((tmp / name).string(), read_file(src.string()));
  }
}

}  // namespace

ImportReport import_hf(const ImportOptions& opt_in) {
  ImportOptions opt = opt_in;
  while (opt.out.size() > 1 && opt.out.back() == '/') opt.out.pop_back();
  if (opt.out.empty()) fail("--out is empty");
  const fs::path from(opt.from), out(opt.out);
  if (fs::exists(out)) fail("--out ", opt.out, " exists; give a new directory");
  if (!fs::is_directory(from)) fail("--from ", opt.from, " is not a directory");
  const std::string config_path = (from / "config.json").string();
  if (!fs::exists(config_path)) fail(opt.from, ": no config.json");
  const HfModelInfo info = model_config_from_hf(read_json(config_path), config_path, opt.max_positions);
  const HfWeights w = open_hf_weights(opt.from);
  const std::vector<ParamInfo> layout = checked_layout(w, info.model, config_path);
  ImportReport rep;
  rep.hf_model_type = info.hf_model_type;
  if (fs::exists(from / "tokenizer.json")) rep.tokenizer = hf_tokenizer_kind(opt.from, info.model.vocab_size);
  else if (opt.require_tokenizer) fail(opt.from, ": no tokenizer.json (pass --no-tokenizer to import the weights alone)");
  std::vector<int64_t> eos = info.eos_token_ids;
  if (const fs::path g = from / "generation_config.json"; fs::exists(g))
    if (auto ids = eos_ids_of(read_json(g.string()), g.string()); !ids.empty()) eos = ids;
  const Config cfg = checkpoint_config(info, rep.tokenizer, out);

  publish_dir_atomic(out.string(), [&](const std::string& tmp_dir) {
    const fs::path tmp(tmp_dir);
    rep.bytes = write_weights(w, layout, (tmp / "model.safetensors").string(), opt.progress);
    write_checkpoint_files(opt, info, cfg, eos, tmp);
    write_file_atomic((tmp / "COMPLETE").string(), "import\n");  // inside: the directory appears complete
  });
  rep.tensors = static_cast<int64_t>(layout.size());
  for (const ParamInfo& p : layout) rep.params += p.numel;
  return rep;
}

}  // namespace jtok
