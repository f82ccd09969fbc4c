// The weights of a Hugging Face model directory: model.safetensors, or the shards that
// model.safetensors.index.json maps tensor names to. Only the headers are read up front; a tensor's
// values are then read in chunks and converted to f32 (BF16, F16 or F32 in the file), so nothing of
// a file's size is ever held in memory.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace jtok {

struct HfWeights {
  std::string dir;
  std::string source;                    // "model.safetensors" or the index's path, for messages
  std::vector<StIndex> files;            // each file's header (offsets checked against its size)
  std::map<std::string, size_t> where;   // tensor name -> its file in `files`

  bool has(const std::string& name) const { return where.count(name) > 0; }
  const StIndex& file_of(const std::string& name) const;
  const StEntry& entry(const std::string& name) const;
};

// Opens dir's weights; errors name the index and the file it names that is missing, a tensor the
// index puts in a file whose header lacks it, and any header inconsistency (a truncated file).
HfWeights open_hf_weights(const std::string& dir);

// Whether a safetensors dtype converts to f32 here: BF16, F16, F32.
bool hf_float_dtype(const std::string& dtype);
// Tensor `name` as f32, chunk by chunk in order: sink(values, count) with at most `chunk` values
// each time (the only memory used: a chunk of the file's bytes and its f32 conversion).
void stream_tensor_f32(const HfWeights& w, const std::string& name,
                       const std::function<void(const float* values, int64_t count)>& sink, int64_t chunk = 1 << 22);

// Element conversions (bit-exact: bf16 and f16 values are exactly representable in f32).
void bf16_to_f32_n(const uint16_t* src, float* dst, int64_t n);
void f16_to_f32_n(const uint16_t* src, float* dst, int64_t n);

}  // namespace jtok
