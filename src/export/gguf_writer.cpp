#include "export/gguf_writer.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <fcntl.h>
#include <filesystem>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "ops/lowp_linear.h"

namespace jtok {

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((absx >> 13) & 0x3ffu));  // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (absx < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // value = absx as float; in units of 2^-24 it is mant * 2^(e - 150 + 24) with the hidden bit.
    const int e = static_cast<int>(absx >> 23);
    if (e < 102) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to zero
    const uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    const int shift = 126 - e;  // 14..24: mant >> shift is the subnormal's units of 2^-24
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  uint32_t h = ((absx >> 13) - ((127u - 15u) << 10));
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is correct rounding
  return static_cast<uint16_t>(sign | h);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  float v;
  if (e == 0) v = std::ldexp(static_cast<float>(m), -24);
  else if (e == 31) v = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else v = std::ldexp(static_cast<float>(m | 0x400u), static_cast<int>(e) - 25);
  uint32_t x;
  std::memcpy(&x, &v, 4);
  x |= sign;
  std::memcpy(&v, &x, 4);
  return v;
}

namespace {

template <typename T>
void put(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host (x86-64, checked below)
  s.append(b, sizeof(T));
}
void put_str(std::string& s, const std::string& v) {
  put<uint64_t>(s, v.size());
  s += v;
}
uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
static_assert(std::endian::native == std::endian::little, "GGUF is written little-endian");

}  // namespace

void GgufWriter::key(const std::string& k, GgufType t) {
  if (k.empty()) fail("gguf: empty metadata key");
  if (std::find(keys_.begin(), keys_.end(), k) != keys_.end()) fail("gguf: metadata key ", k, " added twice");
  keys_.push_back(k);
  put_str(kv_, k);
  put<uint32_t>(kv_, static_cast<uint32_t>(t));
  ++n_kv_;
}
void GgufWriter::add_u32(const std::string& k, uint32_t v) { key(k, GgufType::U32); put(kv_, v); }
void GgufWriter::add_i32(const std::string& k, int32_t v) { key(k, GgufType::I32); put(kv_, v); }
void GgufWriter::add_u64(const std::string& k, uint64_t v) { key(k, GgufType::U64); put(kv_, v); }
void GgufWriter::add_f32(const std::string& k, float v) { key(k, GgufType::F32); put(kv_, v); }
void GgufWriter::add_bool(const std::string& k, bool v) { key(k, GgufType::BOOL); put<uint8_t>(kv_, v ? 1 : 0); }
void GgufWriter::add_string(const std::string& k, const std::string& v) { key(k, GgufType::STRING); put_str(kv_, v); }
void GgufWriter::add_string_array(const std::string& k, const std::vector<std::string>& v) {
  key(k, GgufType::ARRAY);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufType::STRING));
  put<uint64_t>(kv_, v.size());
  for (const auto& s : v) put_str(kv_, s);
}
void GgufWriter::add_i32_array(const std::string& k, const std::vector<int32_t>& v) {
  key(k, GgufType::ARRAY);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufType::I32));
  put<uint64_t>(kv_, v.size());
  for (int32_t x : v) put(kv_, x);
}

uint64_t ggml_bytes(GgmlType t, uint64_t n) {
  switch (t) {
    case GgmlType::F32: return n * 4;
    case GgmlType::F16: return n * 2;
    case GgmlType::Q8_0: return n / kQ8Block * (2 + kQ8Block);
  }
  return 0;
}

void quantize_q8_0(const float* x, uint64_t n, uint8_t* out) {
  for (uint64_t b = 0; b < n / kQ8Block; ++b, x += kQ8Block, out += 2 + kQ8Block) {
    const uint16_t h = f32_to_f16(quantize_int8_span(reinterpret_cast<int8_t*>(out + 2), x, kQ8Block));
    std::memcpy(out, &h, 2);
  }
}

uint64_t GgufWriter::Tensor::nbytes() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return ggml_bytes(type, n);
}

static uint64_t numel_of(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

uint64_t GgufWriter::data_bytes() const {
  if (tensors_.empty()) return 0;
  const Tensor& t = tensors_.back();
  return align_up(t.offset + t.nbytes(), kGgufAlignment);
}

void GgufWriter::add_tensor(const std::string& name, const std::vector<int64_t>& shape, GgmlType type,
                            const float* data) {
  if (name.empty() || name.size() >= 64) fail("gguf: tensor name '", name, "' must have 1..63 bytes (GGML_MAX_NAME)");
  if (shape.empty() || shape.size() > 4) fail("gguf: tensor ", name, " has ", shape.size(), " dimensions (1..4)");
  for (int64_t d : shape)
    if (d <= 0) fail("gguf: tensor ", name, " has a dimension ", d);
  for (const Tensor& t : tensors_)
    if (t.name == name) fail("gguf: tensor ", name, " added twice");
  if (type == GgmlType::Q8_0 && shape.back() % kQ8Block != 0)
    fail("gguf: tensor ", name, "'s rows of ", shape.back(), " values do not split into Q8_0 blocks of ", kQ8Block);
  Tensor t{name, shape, type, data, {}, data_bytes()};
  tensors_.push_back(std::move(t));
}

void GgufWriter::add_tensor(const std::string& name, const std::vector<int64_t>& shape, GgmlType type,
                            std::vector<float> owned) {
  add_tensor(name, shape, type, static_cast<const float*>(nullptr));
  Tensor& t = tensors_.back();
  if (owned.size() != numel_of(shape))
    fail("gguf: tensor ", name, " given ", owned.size(), " values for its shape");
  t.owned = std::move(owned);
}

std::string GgufWriter::header_bytes() const {
  std::string s;
  put<uint32_t>(s, kGgufMagic);
  put<uint32_t>(s, kGgufVersion);
  put<uint64_t>(s, tensors_.size());
  put<uint64_t>(s, n_kv_ + 1);
  // general.alignment first, so a reader knows it before the tensor infos.
  put_str(s, "general.alignment");
  put<uint32_t>(s, static_cast<uint32_t>(GgufType::U32));
  put<uint32_t>(s, kGgufAlignment);
  s += kv_;
  for (const Tensor& t : tensors_) {
    put_str(s, t.name);
    put<uint32_t>(s, static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put<uint64_t>(s, static_cast<uint64_t>(*it));
    put<uint32_t>(s, static_cast<uint32_t>(t.type));
    put<uint64_t>(s, t.offset);
  }
  s.resize(align_up(s.size(), kGgufAlignment), '\0');
  return s;
}

uint64_t GgufWriter::file_size() const { return header_bytes().size() + data_bytes(); }

namespace {

// n values of src as type (F16 or Q8_0) through out, converted kChunk values at a time into conv.
void write_converted(const float* src, uint64_t n, GgmlType type, std::vector<uint8_t>& conv,
                     const std::function<void(const char*, size_t)>& out) {
  const size_t kChunk = 1 << 20;  // values converted at a time (f16, Q8_0: a multiple of the block)
  for (uint64_t i = 0; i < n; i += kChunk) {
    const size_t m = static_cast<size_t>(std::min<uint64_t>(kChunk, n - i));
    conv.resize(ggml_bytes(type, m));
    if (type == GgmlType::F16) {
      for (size_t j = 0; j < m; ++j) {
        const uint16_t h = f32_to_f16(src[i + j]);
        std::memcpy(conv.data() + 2 * j, &h, 2);
      }
    } else {
      quantize_q8_0(src + i, m, conv.data());
    }
    out(reinterpret_cast<const char*>(conv.data()), conv.size());
  }
}

// The written temp file fd (named tmp) made durable and renamed to path; on failure tmp is removed.
void commit_temp(int fd, const std::string& tmp, const std::string& path) {
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    fail("cannot fsync ", tmp, ": ", std::strerror(e));
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail("cannot close ", tmp, ": ", std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail("cannot rename ", tmp, " to ", path, ": ", std::strerror(e));
  }
  fsync_dir(std::filesystem::path(path).parent_path().string());
}

}  // namespace

void GgufWriter::write_data(const std::function<void(const char*, size_t)>& out) const {
  uint64_t pos = 0;  // within the data section
  std::vector<uint8_t> conv;
  for (const Tensor& t : tensors_) {
    if (pos < t.offset) {
      const std::string pad(t.offset - pos, '\0');
      out(pad.data(), pad.size());
      pos = t.offset;
    }
    const float* src = t.owned.empty() ? t.data : t.owned.data();
    const uint64_t n = numel_of(t.shape);
    if (t.type == GgmlType::F32) out(reinterpret_cast<const char*>(src), n * 4);
    else write_converted(src, n, t.type, conv, out);
    pos += t.nbytes();
  }
  const uint64_t end = data_bytes();
  if (pos < end) {
    const std::string pad(end - pos, '\0');
    out(pad.data(), pad.size());
  }
}

void GgufWriter::write(const std::string& path) const {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("cannot create ", tmp, ": ", std::strerror(errno));
  auto write_all = [&](const char* p, size_t n) {  // loops on short writes (core/atomic_file.h)
    try {
      jtok::write_all(fd, std::string_view(p, n), path + " (temporary " + tmp + ")");
    } catch (...) {
      ::close(fd);
      ::unlink(tmp.c_str());
      throw;
    }
  };
  const std::string head = header_bytes();
  write_all(head.data(), head.size());
  write_data(write_all);
  commit_temp(fd, tmp, path);
}

}  // namespace jtok
