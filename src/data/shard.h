// Token shards: a 128-byte little-endian header, then n_tokens tokens of token_bytes each.
// Full layout in docs/formats.md. Documents are separated by the end-of-text token (each
// document is preceded by it). Written to a temp name, fsynced, then renamed, so a reader
// never sees a half-written shard.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace jtok {

constexpr char kShardMagic[8] = {'J', 'T', 'O', 'K', 'S', 'H', 'R', 'D'};
constexpr uint32_t kShardVersion = 1;
constexpr uint32_t kShardHeaderBytes = 128;

struct ShardInfo {
  uint32_t version = kShardVersion;
  uint32_t token_bytes = 0;   // 2 (vocab <= 65536) or 4
  uint32_t vocab_size = 0;    // of the tokenizer that made it
  uint64_t n_tokens = 0;
  uint64_t n_documents = 0;   // end-of-text tokens in the shard
  uint64_t tokenizer_fingerprint = 0;
  uint64_t checksum = 0;      // FNV-1a 64 of the token bytes as stored
  std::string tokenizer;      // "gpt2", "qwen3" (at most 31 bytes)
};

uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 1469598103934665603ULL);

// Writes tokens (each < info.vocab_size) to path atomically; fills token_bytes, n_tokens,
// checksum. n_documents and the tokenizer fields are taken from info.
void write_shard(const std::string& path, ShardInfo info, const std::vector<int32_t>& tokens);

// A shard mapped read-only. Opening validates the header, the file size and (by default) the
// checksum; every error names the file.
class Shard {
 public:
  explicit Shard(const std::string& path, bool verify_checksum = true);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;
  Shard(Shard&& o) noexcept;

  const ShardInfo& info() const { return info_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return info_.n_tokens; }
  uint32_t token(uint64_t i) const {
    return info_.token_bytes == 2 ? reinterpret_cast<const uint16_t*>(data_)[i]
                                  : reinterpret_cast<const uint32_t*>(data_)[i];
  }
  // Fails naming this shard if it was not made by the given tokenizer (fingerprint 0: any).
  void check_tokenizer(const std::string& name, uint64_t fingerprint) const;

 private:
  std::string path_;
  ShardInfo info_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* data_ = nullptr;
};

}  // namespace jtok
