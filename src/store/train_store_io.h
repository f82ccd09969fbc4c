// The byte-level pieces of the training table store (store/train_table_store.h) shared by its
// file side (train_table_store.cpp: create, open, roll-back) and its cache (train_table_store_cache.cpp):
// unit checksums, whole preads / pwrites that fail naming the file, and the undo log's header.
#pragma once
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/checksum.h"
#include "core/error.h"

namespace jtok::train_store {

constexpr int64_t kPage = 4096, kSum = 8, kHeader = 32, kRecordHead = 16;
constexpr char kMagic[8] = {'J', 'T', 'O', 'K', 'U', 'N', 'D', 'O'};

// A unit keeps its last 8 bytes for the sum64 (core/checksum.h) of the others.
inline void seal_unit(uint8_t* u, int64_t unit_bytes) {
  const uint64_t s = sum64(kFnvOffset, u, static_cast<size_t>(unit_bytes - kSum));
  std::memcpy(u + unit_bytes - kSum, &s, kSum);
}
inline bool unit_ok(const uint8_t* u, int64_t unit_bytes) {
  uint64_t s;
  std::memcpy(&s, u + unit_bytes - kSum, kSum);
  return s == sum64(kFnvOffset, u, static_cast<size_t>(unit_bytes - kSum));
}

// A log record's checksum: of its unit's byte offset (8 bytes) and the unit's old bytes.
inline uint64_t record_sum(const uint8_t* offset8, const uint8_t* bytes, int64_t unit_bytes) {
  return sum64(fnv1a_bytes(kFnvOffset, offset8, 8), bytes, static_cast<size_t>(unit_bytes));
}

inline void pread_all(int fd, void* dst, int64_t n, int64_t at, const std::string& path) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, static_cast<size_t>(n), at);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) fail("cannot read ", path, " at byte ", at, ": ", got < 0 ? std::strerror(errno) : "end of file (truncated)");
    p += got, n -= got, at += got;
  }
}
inline void pwrite_all(int fd, const void* src, int64_t n, int64_t at, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(src);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, static_cast<size_t>(n), at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("cannot write ", path, " at byte ", at, ": ", w < 0 ? std::strerror(errno) : "no progress");
    p += w, n -= w, at += w;
  }
}
inline void fsync_or_fail(int fd, const std::string& path) {
  if (::fsync(fd) != 0) fail("cannot fsync ", path, ": ", std::strerror(errno));
}

// The log header: magic, base step, target step (-1: none), checksum of the 24 bytes before it.
inline std::string log_header(int64_t base, int64_t target) {
  uint8_t h[kHeader];
  std::memcpy(h, kMagic, 8);
  std::memcpy(h + 8, &base, 8);
  std::memcpy(h + 16, &target, 8);
  const uint64_t s = fnv1a_bytes(kFnvOffset, h, 24);
  std::memcpy(h + 24, &s, 8);
  return std::string(reinterpret_cast<const char*>(h), kHeader);
}

}  // namespace jtok::train_store
