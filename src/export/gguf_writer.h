// GGUF v3 files (the format of llama.cpp / ggml; docs/formats.md "GGUF export"): a header, typed
// metadata key-values, tensor infos, then each tensor's data at an offset aligned to
// general.alignment. All integers little-endian. The writer streams tensor data to a temp name,
// fsyncs and renames it (nothing of the file's size is held in memory beyond the tensors given).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace jtok {

// GGUF metadata value types (gguf_type in ggml's gguf.h).
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
// Tensor element types written here (ggml_type): F32 = 0, F16 = 1, Q8_0 = 8 (blocks of 32 values
// along the innermost dimension: an f16 scale d = max|x| / 127, then 32 int8 q = round(x / d)).
enum class GgmlType : uint32_t { F32 = 0, F16 = 1, Q8_0 = 8 };
inline constexpr int64_t kQ8Block = 32;
// Bytes of n values of type t (Q8_0: n a multiple of kQ8Block).
uint64_t ggml_bytes(GgmlType t, uint64_t n);
// n values (a multiple of kQ8Block) as Q8_0 blocks into out (ggml_bytes(Q8_0, n) bytes).
void quantize_q8_0(const float* x, uint64_t n, uint8_t* out);

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" as a little-endian u32
inline constexpr uint32_t kGgufVersion = 3;
inline constexpr uint32_t kGgufAlignment = 32;      // written as general.alignment

// IEEE binary16 of f, round to nearest even (overflow to inf, NaN kept a NaN).
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

class GgufWriter {
 public:
  // Metadata, written in the order added; a key may appear once (checked).
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_u64(const std::string& key, uint64_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_string_array(const std::string& key, const std::vector<std::string>& v);
  void add_i32_array(const std::string& key, const std::vector<int32_t>& v);

  // A tensor of row-major `shape` (outermost first, as our weights: (out, in)); GGUF lists the
  // dimensions innermost first, so ne = reversed shape. `data` (numel floats) must stay valid
  // until write(); `owned` keeps a buffer alive with the writer (e.g. a permuted copy).
  void add_tensor(const std::string& name, const std::vector<int64_t>& shape, GgmlType type, const float* data);
  void add_tensor(const std::string& name, const std::vector<int64_t>& shape, GgmlType type, std::vector<float> owned);

  // Header + metadata + tensor infos + padding: everything before the first tensor's data.
  std::string header_bytes() const;
  // The whole file written to "<path>.tmp.<pid>", fsynced, renamed to path, directory fsynced.
  // Errors name the file; a failed write leaves nothing under path or the temp name.
  void write(const std::string& path) const;
  // Bytes of the whole file (small files: tests).
  uint64_t file_size() const;

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    GgmlType type;
    const float* data;
    std::vector<float> owned;
    uint64_t offset = 0;  // from the start of the data section
    uint64_t nbytes() const;
  };
  // The data section (tensors at their offsets, padded to its aligned size) through out.
  void write_data(const std::function<void(const char*, size_t)>& out) const;
  std::string kv_;             // encoded key-values
  uint64_t n_kv_ = 0;
  std::vector<std::string> keys_;
  std::vector<Tensor> tensors_;
  void key(const std::string& k, GgufType t);
  uint64_t data_bytes() const;
};

}  // namespace jtok
