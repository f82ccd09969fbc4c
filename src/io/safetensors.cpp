#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_int.h"

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

namespace {

// An open file descriptor, closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly n bytes at offset, or fails naming the file.
void pread_all(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path, const std::string& what) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, std::min<uint64_t>(n, 1ULL << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail("safetensors file ", path, ": cannot read ", what, ": ", r < 0 ? std::strerror(errno) : "unexpected end of file");
    p += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

Fd open_for_read(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY);
  if (f.fd < 0) fail("cannot read ", path, ": ", std::strerror(errno));
  return f;
}

// Checks one header entry against the data section (data_len bytes from data_start).
StEntry parse_entry(const nlohmann::json& e, const std::string& where, uint64_t data_start, uint64_t data_len) {
  if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
    fail(where, ": entry needs dtype, shape and data_offsets");
  StEntry t;
  t.dtype = e["dtype"].is_string() ? e["dtype"].get<std::string>() : "";
  const int64_t es = dtype_size(t.dtype);
  if (es < 0) fail(where, ": unknown dtype ", e["dtype"].dump());
  if (!e["shape"].is_array()) fail(where, ": shape is not a list");
  // The element count, checked for overflow: a shape like [2^62, 4] must not wrap to a small span.
  uint64_t numel = 1;
  for (auto& s : e["shape"]) {
    const auto dim = json_int64(s);
    if (!dim || *dim < 0) fail(where, ": bad shape ", e["shape"].dump());
    t.shape.push_back(*dim);
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(*dim), &numel) || numel > (1ULL << 62))
      fail(where, ": shape ", e["shape"].dump(), " has more elements than any file can hold");
  }
  const auto& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    fail(where, ": bad data_offsets ", off.dump());
  const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
  if (b > en || en > data_len)
    fail(where, ": data_offsets [", b, ", ", en, "] go beyond the data (", data_len, " bytes); file truncated?");
  if (en - b != numel * static_cast<uint64_t>(es))
    fail(where, ": ", en - b, " bytes of data for shape ", e["shape"].dump(), " of ", t.dtype, " (", numel, " elements)");
  t.offset = data_start + b;
  t.nbytes = en - b;
  return t;
}

}  // namespace

StIndex read_safetensors_index(const std::string& path) {
  Fd f = open_for_read(path);
  struct stat sb;
  if (::fstat(f.fd, &sb) != 0) fail("cannot stat ", path, ": ", std::strerror(errno));
  StIndex idx;
  idx.path = path;
  idx.file_size = static_cast<uint64_t>(sb.st_size);
  if (idx.file_size < 8) fail("safetensors file ", path, " is truncated (", idx.file_size, " bytes, no header)");
  uint64_t hlen = 0;
  pread_all(f.fd, &hlen, 8, 0, path, "the header length");
  if (hlen > idx.file_size - 8)
    fail("safetensors file ", path, ": header length ", hlen, " goes beyond the file (", idx.file_size, " bytes)");
  std::string header(hlen, '\0');
  pread_all(f.fd, header.data(), hlen, 8, path, "the header");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    fail("safetensors file ", path, ": header is not valid JSON: ", e.what());
  }
  if (!h.is_object()) fail("safetensors file ", path, ": header is not a JSON object");
  const uint64_t data_start = 8 + hlen, data_len = idx.file_size - data_start;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it.value().is_object())
        for (auto m = it.value().begin(); m != it.value().end(); ++m)
          if (m.value().is_string()) idx.metadata[m.key()] = m.value().get<std::string>();
      continue;
    }
    idx.tensors.emplace(it.key(), parse_entry(it.value(), "safetensors file " + path + ": tensor " + it.key(), data_start, data_len));
  }
  return idx;
}

void read_tensor_bytes(const StIndex& index, const std::string& name, void* dst) {
  auto it = index.tensors.find(name);
  if (it == index.tensors.end()) fail(index.path, ": missing tensor ", name);
  Fd f = open_for_read(index.path);
  pread_all(f.fd, dst, it->second.nbytes, it->second.offset, index.path, "tensor " + name);
}

void read_tensor_range(const StIndex& index, const std::string& name, uint64_t begin, uint64_t n, void* dst) {
  auto it = index.tensors.find(name);
  if (it == index.tensors.end()) fail(index.path, ": missing tensor ", name);
  if (begin > it->second.nbytes || n > it->second.nbytes - begin)
    fail(index.path, ": tensor ", name, " has ", it->second.nbytes, " bytes, asked for [", begin, ", ", begin + n, ")");
  Fd f = open_for_read(index.path);
  pread_all(f.fd, dst, n, it->second.offset + begin, index.path, "tensor " + name);
}

StFile read_safetensors(const std::string& path) {
  StIndex idx = read_safetensors_index(path);
  StFile f;
  f.metadata = idx.metadata;
  Fd fd = open_for_read(path);
  for (const auto& [name, e] : idx.tensors) {
    StTensor t{e.dtype, e.shape, std::string(e.nbytes, '\0')};
    pread_all(fd.fd, t.bytes.data(), e.nbytes, e.offset, path, "tensor " + name);
    f.tensors.emplace(name, std::move(t));
  }
  return f;
}

StLayout safetensors_layout(const std::map<std::string, StShape>& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  StLayout L;
  uint64_t off = 0;
  for (auto& [name, t] : tensors) {
    int64_t n = 1;
    for (int64_t s : t.shape) n *= s;
    const uint64_t bytes = static_cast<uint64_t>(n * dtype_size(t.dtype));
    h[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
    L.offset[name] = off;
    off += bytes;
  }
  std::string header = h.dump();
  while ((header.size() + 8) % 8 != 0) header.push_back(' ');  // align data to 8 bytes, as HF does
  const uint64_t hl = header.size();
  L.head.assign(reinterpret_cast<const char*>(&hl), 8);
  L.head += header;
  for (auto& [name, o] : L.offset) o += L.head.size();
  L.size = L.head.size() + off;
  return L;
}

void write_safetensors(const std::string& path, const StFile& f) {
  std::map<std::string, StShape> shapes;
  for (auto& [name, t] : f.tensors) {
    JTOK_CHECK(static_cast<int64_t>(t.bytes.size()) == t.numel() * dtype_size(t.dtype), "tensor ", name);
    shapes[name] = {t.dtype, t.shape};
  }
  const StLayout L = safetensors_layout(shapes, f.metadata);
  std::string out;
  out.reserve(L.size);
  out += L.head;
  for (auto& [name, t] : f.tensors) out += t.bytes;
  write_file_atomic(path, out);
}

}  // namespace jtok
