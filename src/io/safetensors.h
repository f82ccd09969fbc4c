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

// A file's header alone: each tensor's dtype, shape and where its bytes lie, checked against the
// file's size, so that tensors can be read one at a time straight into their destination (loading a
// checkpoint holds the model and nothing of the file's size beside it).
struct StEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0, nbytes = 0;  // offset from the start of the file
};
struct StIndex {
  std::string path;
  uint64_t file_size = 0;
  std::map<std::string, StEntry> tensors;
  std::map<std::string, std::string> metadata;
};
// Throws jtok::Error naming the file on any inconsistency (truncated file, header length beyond
// the file, bad JSON, unknown dtype, a shape whose element count overflows or disagrees with its
// byte span, offsets beyond the end).
StIndex read_safetensors_index(const std::string& path);
// Reads tensor `name`'s bytes (entry.nbytes of them) into dst; errors name the file and tensor.
void read_tensor_bytes(const StIndex& index, const std::string& name, void* dst);
// Bytes [begin, begin + n) of tensor `name` into dst (a rank's rows of a table: dist::ShardedTables).
void read_tensor_range(const StIndex& index, const std::string& name, uint64_t begin, uint64_t n, void* dst);

// The whole file in memory (small files: test batches, parity dumps). Same checks as the index.
StFile read_safetensors(const std::string& path);
// Written atomically (temp name, fsync, rename).
void write_safetensors(const std::string& path, const StFile& f);

// The layout write_safetensors gives tensors of these dtypes and shapes (in name order), so that
// several writers can fill one file in place at the tensors' offsets (a checkpoint written by
// every rank of a distributed run, each its own rows: train/checkpoint.h) and get the same bytes:
// `head` is the 8-byte header length and the padded JSON header, `offset[name]` where a tensor's
// bytes start in the file, `size` the file's size.
struct StLayout {
  std::string head;
  std::map<std::string, uint64_t> offset;
  uint64_t size = 0;
};
struct StShape {
  std::string dtype;
  std::vector<int64_t> shape;
};
StLayout safetensors_layout(const std::map<std::string, StShape>& tensors, const std::map<std::string, std::string>& metadata);

StTensor st_f32(const std::vector<int64_t>& shape, const float* data);
StTensor st_i32(const std::vector<int64_t>& shape, const int32_t* data);

}  // namespace jtok
