#include "io/safetensors.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace jtok {

static int64_t dtype_size(const std::string& dt) {
  if (dt == "F32" || dt == "I32") return 4;
  if (dt == "F64" || dt == "I64") return 8;
  if (dt == "U8" || dt == "I8" || dt == "BOOL") return 1;
  if (dt == "F16" || dt == "BF16" || dt == "I16") return 2;
  return -1;
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::vector<float> StTensor::as_f32() const {
  JTOK_CHECK(dtype == "F32", "tensor dtype is ", dtype);
  std::vector<float> v(static_cast<size_t>(numel()));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

std::vector<int32_t> StTensor::as_i32() const {
  JTOK_CHECK(dtype == "I32", "tensor dtype is ", dtype);
  std::vector<int32_t> v(static_cast<size_t>(numel()));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(int32_t));
  return v;
}

StTensor st_f32(const std::vector<int64_t>& shape, const float* data) {
  StTensor t{"F32", shape, {}};
  t.bytes.assign(reinterpret_cast<const char*>(data), static_cast<size_t>(t.numel()) * 4);
  return t;
}

StTensor st_i32(const std::vector<int64_t>& shape, const int32_t* data) {
  StTensor t{"I32", shape, {}};
  t.bytes.assign(reinterpret_cast<const char*>(data), static_cast<size_t>(t.numel()) * 4);
  return t;
}

StFile read_safetensors(const std::string& path) {
  std::string raw = read_file(path);
  if (raw.size() < 8) fail("safetensors file ", path, " is truncated (", raw.size(), " bytes, no header)");
  uint64_t hlen = 0;
  std::memcpy(&hlen, raw.data(), 8);
  if (hlen > raw.size() - 8)
    fail("safetensors file ", path, ": header length ", hlen, " goes beyond the file (", raw.size(), " bytes)");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(raw.substr(8, hlen));
  } catch (const nlohmann::json::parse_error& e) {
    fail("safetensors file ", path, ": header is not valid JSON: ", e.what());
  }
  if (!h.is_object()) fail("safetensors file ", path, ": header is not a JSON object");
  const uint64_t data_start = 8 + hlen, data_len = raw.size() - data_start;
  StFile f;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it.value().is_object())
        for (auto m = it.value().begin(); m != it.value().end(); ++m)
          if (m.value().is_string()) f.metadata[m.key()] = m.value().get<std::string>();
      continue;
    }
    const auto& e = it.value();
    auto where = [&] { return "safetensors file " + path + ": tensor " + it.key(); };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      fail(where(), ": entry needs dtype, shape and data_offsets");
    StTensor t;
    t.dtype = e["dtype"].is_string() ? e["dtype"].get<std::string>() : "";
    int64_t es = dtype_size(t.dtype);
    if (es < 0) fail(where(), ": unknown dtype ", e["dtype"].dump());
    if (!e["shape"].is_array()) fail(where(), ": shape is not a list");
    for (auto& s : e["shape"]) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0) fail(where(), ": bad shape ", e["shape"].dump());
      t.shape.push_back(s.get<int64_t>());
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(where(), ": bad data_offsets ", off.dump());
    uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > data_len)
      fail(where(), ": data_offsets [", b, ", ", en, "] go beyond the data (", data_len, " bytes); file truncated?");
    if (static_cast<int64_t>(en - b) != t.numel() * es)
      fail(where(), ": ", en - b, " bytes of data for shape ", e["shape"].dump(), " of ", t.dtype);
    t.bytes = raw.substr(data_start + b, en - b);
    f.tensors.emplace(it.key(), std::move(t));
  }
  return f;
}

void write_safetensors(const std::string& path, const StFile& f) {
  nlohmann::json h = nlohmann::json::object();
  if (!f.metadata.empty()) h["__metadata__"] = f.metadata;
  uint64_t off = 0;
  for (auto& [name, t] : f.tensors) {
    JTOK_CHECK(static_cast<int64_t>(t.bytes.size()) == t.numel() * dtype_size(t.dtype), "tensor ", name);
    h[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string header = h.dump();
  while ((header.size() + 8) % 8 != 0) header.push_back(' ');  // align data to 8 bytes, as HF does
  std::string out;
  out.reserve(8 + header.size() + off);
  uint64_t hl = header.size();
  out.append(reinterpret_cast<const char*>(&hl), 8);
  out += header;
  for (auto& [name, t] : f.tensors) out += t.bytes;
  write_file_atomic(path, out);
}

}  // namespace jtok
