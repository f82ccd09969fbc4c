// safetensors files (Hugging Face's format): 8-byte little-endian header length N, N bytes of
// JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the raw little-endian data. Anyone with numpy can read what we write.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace jtok {

struct StTensor {
  std::string dtype;            // "F32", "F64", "I32", "I64", "U8"
  std::vector<int64_t> shape;
  std::string bytes;            // raw little-endian data

  int64_t numel() const;
  // Typed views; the dtype must match (checked).
  std::vector<float> as_f32() const;
  std::vector<int32_t> as_i32() const;
};

struct StFile {
  std::map<std::string, StTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Throws jtok::Error naming the file on any inconsistency (truncated file, header length beyond
// the file, bad JSON, unknown dtype, offsets that disagree with shapes or overlap the end).
StFile read_safetensors(const std::string& path);
// Written atomically (temp name, fsync, rename).
void write_safetensors(const std::string& path, const StFile& f);

StTensor st_f32(const std::vector<int64_t>& shape, const float* data);
StTensor st_i32(const std::vector<int64_t>& shape, const int32_t* data);

}  // namespace jtok
