#include "hf/hf_weights.h"

#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "export/gguf_writer.h"
#include "ops/lowp_linear.h"

namespace jtok {

namespace fs = std::filesystem;
using json = nlohmann::json;

const StIndex& HfWeights::file_of(const std::string& name) const {
  auto it = where.find(name);
  if (it == where.end()) fail(source, ": no tensor ", name);
  return files[it->second];
}

const StEntry& HfWeights::entry(const std::string& name) const { return file_of(name).tensors.at(name); }

namespace {

// The index's weight_map: tensor name -> shard file name (relative to dir).
std::map<std::string, std::string> read_weight_map(const std::string& path) {
  json j;
  try {
    j = json::parse(read_file(path));
  } catch (const json::exception& e) {
    fail(path, " is not valid JSON: ", e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object())
    fail(path, ": expected an object with a weight_map object (tensor name -> shard file)");
  std::map<std::string, std::string> map;
  for (auto it = j.at("weight_map").begin(); it != j.at("weight_map").end(); ++it) {
    if (!it.value().is_string()) fail(path, ": weight_map entry ", it.key(), " is not a file name: ", it.value().dump());
    const std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      fail(path, ": weight_map entry ", it.key(), " names '", file, "', not a file in the same directory");
    map[it.key()] = file;
  }
  if (map.empty()) fail(path, ": weight_map is empty");
  return map;
}

HfWeights open_sharded(const fs::path& dir, const fs::path& index) {
  HfWeights w;
  w.dir = dir.string();
  w.source = index.string();
  const auto map = read_weight_map(w.source);
  std::map<std::string, size_t> file_no;
  for (const auto& [tensor, file] : map) {
    if (!file_no.count(file)) {
      const fs::path p = dir / file;
      if (!fs::is_regular_file(p))
        fail(w.source, " names shard ", file, " (first for tensor ", tensor, "), which is not there: ", p.string());
      file_no[file] = w.files.size();
      w.files.push_back(read_safetensors_index(p.string()));
    }
    const StIndex& f = w.files[file_no.at(file)];
    if (!f.tensors.count(tensor))
      fail(w.source, " puts tensor ", tensor, " in ", f.path, ", whose header does not have it");
    w.where[tensor] = file_no.at(file);
  }
  return w;
}

}  // namespace

HfWeights open_hf_weights(const std::string& dir_name) {
  const fs::path dir(dir_name), single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) return open_sharded(dir, index);
  if (!fs::exists(single))
    fail(dir_name, ": no weights (neither model.safetensors nor model.safetensors.index.json)");
  HfWeights w;
  w.dir = dir_name;
  w.source = single.string();
  w.files.push_back(read_safetensors_index(w.source));
  for (const auto& [name, e] : w.files[0].tensors) w.where[name] = 0;
  return w;
}

bool hf_float_dtype(const std::string& dt) { return dt == "BF16" || dt == "F16" || dt == "F32"; }

void bf16_to_f32_n(const uint16_t* src, float* dst, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= (1 << 18))
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

void f16_to_f32_n(const uint16_t* src, float* dst, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= (1 << 18))
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void stream_tensor_f32(const HfWeights& w, const std::string& name,
                       const std::function<void(const float*, int64_t)>& sink, int64_t chunk) {
  const StIndex& f = w.file_of(name);
  const StEntry& e = f.tensors.at(name);
  if (!hf_float_dtype(e.dtype)) fail(f.path, ": tensor ", name, " has dtype ", e.dtype, " (expected BF16, F16 or F32)");
  const int64_t esize = e.dtype == "F32" ? 4 : 2;
  const int64_t n = static_cast<int64_t>(e.nbytes) / esize;
  std::vector<float> out(static_cast<size_t>(std::min(n, chunk)));
  std::vector<uint16_t> half(e.dtype == "F32" ? 0 : out.size());
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t c = std::min(chunk, n - i);
    const uint64_t begin = static_cast<uint64_t>(i * esize), bytes = static_cast<uint64_t>(c * esize);
    if (e.dtype == "F32") {
      read_tensor_range(f, name, begin, bytes, out.data());
    } else {
      read_tensor_range(f, name, begin, bytes, half.data());
      (e.dtype == "BF16" ? bf16_to_f32_n : f16_to_f32_n)(half.data(), out.data(), c);
    }
    sink(out.data(), c);
  }
}

}  // namespace jtok
