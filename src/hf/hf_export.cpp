#include "hf/hf_export.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "hf/hf_config.h"
#include "hf/st_stream.h"
#include "ops/lowp_linear.h"

namespace jtok {

namespace fs = std::filesystem;

namespace {

// Rows of a parameter written to the HF file: the real vocabulary's for the embedding and LM head.
std::vector<int64_t> hf_shape(const ParamInfo& p, const ModelConfig& c) {
  std::vector<int64_t> s = p.shape;
  if (p.name == "model.embed_tokens.weight" || p.name == "lm_head.weight") s[0] = c.vocab_size;
  return s;
}

// Values [0, n) of a parameter as `dtype` bytes, in chunks.
void put_values(const float* x, int64_t n, const std::string& dtype, const std::function<void(std::string_view)>& put) {
  constexpr int64_t kChunk = 1 << 20;
  if (dtype == "f32") {
    put(std::string_view(reinterpret_cast<const char*>(x), static_cast<size_t>(n) * sizeof(float)));
    return;
  }
  std::vector<uint16_t> half(static_cast<size_t>(std::min(n, kChunk)));
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t c = std::min(kChunk, n - i);
    quantize_bf16(half.data(), x + i, c);  // round to nearest even
    put(std::string_view(reinterpret_cast<const char*>(half.data()), static_cast<size_t>(c) * 2));
  }
}

nlohmann::json config_json(const ModelConfig& c, const std::string& origin, const HfExportOptions& opt) {
  nlohmann::json j = hf_config_from_model(c, origin);
  j["torch_dtype"] = opt.dtype == "f32" ? "float32" : "bfloat16";
  if (opt.eos_token_id >= 0) j["eos_token_id"] = opt.eos_token_id;
  return j;
}

}  // namespace

uint64_t export_hf(const Model& m, const std::string& origin, const std::string& out_in, const HfExportOptions& opt) {
  std::string out = out_in;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  if (opt.dtype != "bf16" && opt.dtype != "f32") fail("export --format hf: dtype '", opt.dtype, "' (known: bf16, f32)");
  if (fs::exists(out)) fail("--out ", out, " exists; give a new directory");
  if (m.lowp.any()) fail("export: ", origin, " holds low-precision weights (itself an export); export from its fp32 checkpoint");
  const ModelConfig& c = m.cfg;
  const nlohmann::json config = config_json(c, origin, opt);  // refuses what HF has no architecture for
  std::map<std::string, StShape> shapes;
  std::map<std::string, const ParamInfo*> by_name;
  for (const ParamInfo& p : m.layout) {
    shapes[p.name] = {opt.dtype == "f32" ? "F32" : "BF16", hf_shape(p, c)};
    by_name[p.name] = &p;
  }
  uint64_t bytes = 0;
  publish_dir_atomic(out, [&](const std::string& tmp_dir) {
    const fs::path tmp(tmp_dir);
    bytes = write_safetensors_streamed((tmp / "model.safetensors").string(), shapes, {{"format", "pt"}},
                                       [&](const std::string& name, const auto& put) {
                                         const ParamInfo& p = *by_name.at(name);
                                         int64_t n = 1;
                                         for (int64_t s : hf_shape(p, c)) n *= s;  // real rows come first
                                         put_values(m.params.data() + p.offset, n, opt.dtype, put);
                                       });
    write_file_atomic((tmp / "config.json").string(), config.dump(2) + "\n");
    for (const char* name : kHfSideFiles)
      if (const fs::path src = fs::path(opt.tokenizer_dir) / name; !opt.tokenizer_dir.empty() && fs::exists(src))
        write_file_atomic((tmp / name).string(), read_file(src.string()));
  });
  return bytes;
}

}  // namespace jtok
