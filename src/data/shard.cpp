// Shard reading (mmap) and atomic writing.
#include "data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include "core/atomic_file.h"
#include "core/error.h"

namespace jtok {
namespace {
template <typename T>
void put(unsigned char* h, size_t off, T v) { std::memcpy(h + off, &v, sizeof v); }  // little-endian host
template <typename T>
T get(const unsigned char* h, size_t off) { T v; std::memcpy(&v, h + off, sizeof v); return v; }

}  // namespace

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) { h ^= p[i]; h *= 1099511628211ULL; }
  return h;
}

void write_shard(const std::string& path, ShardInfo info, const std::vector<int32_t>& tokens) {
  if (info.vocab_size == 0) fail("shard ", path, ": vocab_size must be set");
  if (info.tokenizer.size() > 31) fail("shard ", path, ": tokenizer name too long");
  info.token_bytes = info.vocab_size <= 65536 ? 2 : 4;
  info.n_tokens = tokens.size();
  std::vector<unsigned char> body(tokens.size() * info.token_bytes);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || uint32_t(tokens[i]) >= info.vocab_size)
      fail("shard ", path, ": token ", tokens[i], " at position ", i, " outside vocab size ", info.vocab_size);
    if (info.token_bytes == 2) put<uint16_t>(body.data(), 2 * i, uint16_t(tokens[i]));
    else put<uint32_t>(body.data(), 4 * i, uint32_t(tokens[i]));
  }
  info.checksum = fnv1a64(body.data(), body.size());
  unsigned char h[kShardHeaderBytes] = {};
  std::memcpy(h, kShardMagic, 8);
  put<uint32_t>(h, 8, kShardVersion);
  put<uint32_t>(h, 12, kShardHeaderBytes);
  put<uint32_t>(h, 16, info.token_bytes);
  put<uint32_t>(h, 20, info.vocab_size);
  put<uint64_t>(h, 24, info.n_tokens);
  put<uint64_t>(h, 32, info.n_documents);
  put<uint64_t>(h, 40, info.tokenizer_fingerprint);
  put<uint64_t>(h, 48, info.checksum);
  std::memcpy(h + 56, info.tokenizer.data(), info.tokenizer.size());

  // Temp name in the same directory (hidden, not *.bin), fsync, rename, fsync the directory.
  std::filesystem::path p(path);
  std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
  std::string tmp_name = p.filename().string();
  tmp_name.insert(tmp_name.begin(), '.');
  tmp_name += ".tmp-" + std::to_string(::getpid());
  write_file_atomic(path, (dir / tmp_name).string(),
                    {std::string_view(reinterpret_cast<const char*>(h), sizeof h),
                     std::string_view(reinterpret_cast<const char*>(body.data()), body.size())},
                    "shard " + path);
}

Shard::Shard(const std::string& path, bool verify_checksum) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("shard ", path, ": cannot open: ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) { ::close(fd); fail("shard ", path, ": cannot stat"); }
  size_t bytes = size_t(st.st_size);
  if (bytes < kShardHeaderBytes) {
    ::close(fd);
    fail("shard ", path, ": truncated or not a jtok shard (", bytes, " bytes, the header alone is ", kShardHeaderBytes, ")");
  }
  map_ = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) { map_ = nullptr; fail("shard ", path, ": mmap failed: ", std::strerror(errno)); }
  map_bytes_ = bytes;
  const unsigned char* h = static_cast<const unsigned char*>(map_);
  try {
    if (std::memcmp(h, kShardMagic, 8) != 0) fail("shard ", path, ": not a jtok shard (bad magic)");
    info_.version = get<uint32_t>(h, 8);
    if (info_.version != kShardVersion)
      fail("shard ", path, ": format version ", info_.version, " unsupported (this build reads ", kShardVersion, ")");
    uint32_t header_bytes = get<uint32_t>(h, 12);
    if (header_bytes != kShardHeaderBytes) fail("shard ", path, ": header size ", header_bytes, " unexpected");
    info_.token_bytes = get<uint32_t>(h, 16);
    if (info_.token_bytes != 2 && info_.token_bytes != 4) fail("shard ", path, ": token width ", info_.token_bytes, " invalid");
    info_.vocab_size = get<uint32_t>(h, 20);
    info_.n_tokens = get<uint64_t>(h, 24);
    info_.n_documents = get<uint64_t>(h, 32);
    info_.tokenizer_fingerprint = get<uint64_t>(h, 40);
    info_.checksum = get<uint64_t>(h, 48);
    info_.tokenizer.assign(reinterpret_cast<const char*>(h + 56), strnlen(reinterpret_cast<const char*>(h + 56), 32));
    uint64_t want = kShardHeaderBytes + info_.n_tokens * info_.token_bytes;
    if (info_.n_tokens > (uint64_t(1) << 40) || want != bytes)
      fail("shard ", path, ": truncated or padded: header says ", info_.n_tokens, " tokens (", want,
           " bytes) but the file has ", bytes, " bytes");
    data_ = h + kShardHeaderBytes;
    if (verify_checksum && fnv1a64(data_, bytes - kShardHeaderBytes) != info_.checksum)
      fail("shard ", path, ": corrupt (checksum mismatch)");
  } catch (...) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
}

Shard::Shard(Shard&& o) noexcept
    : path_(std::move(o.path_)), info_(std::move(o.info_)), map_(o.map_), map_bytes_(o.map_bytes_), data_(o.data_) {
  o.map_ = nullptr;
  o.data_ = nullptr;
}

Shard::~Shard() {
  if (map_) ::munmap(map_, map_bytes_);
}

void Shard::check_tokenizer(const std::string& name, uint64_t fingerprint) const {
  if (info_.tokenizer != name || (fingerprint && info_.tokenizer_fingerprint != fingerprint))
    fail("shard ", path_, ": made by tokenizer '", info_.tokenizer, "' (fingerprint ", std::hex,
         info_.tokenizer_fingerprint, "), but the model uses '", name, "' (fingerprint ", fingerprint, std::dec,
         "); re-run jtok prepare with the model's tokenizer");
}

}  // namespace jtok
