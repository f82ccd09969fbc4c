// Checksums of the table stores' files (store/table_store.h, store/train_table_store.h):
//   fnv1a_bytes  FNV-1a 64, byte by byte (~0.6 GB/s: one multiply chain a byte), for short headers
//                and older files;
//   sum64        four 64-bit lanes over the little-endian words (lane l takes words l, l + 4, ...),
//                each word mixed in as lane = rotl(lane + w * K2, 31) * K1, so a difference in any
//                bit reaches every bit of its lane; then the lanes, the tail bytes (FNV-1a) and the
//                length folded and avalanched: four independent multiply chains, ~10 GB/s here;
//   sum64_pages  sum64 chained over 4 KiB pages (h = sum64(h, page)), so a file can be summed in any
//                read size that is a whole number of pages.
// The formats are in docs/formats.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace jtok {

constexpr uint64_t kFnvOffset = 14695981039346656037ULL;

inline uint64_t fnv1a_bytes(uint64_t h, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t sum64(uint64_t seed, const uint8_t* p, size_t n) {
  constexpr uint64_t K1 = 0x9E3779B185EBCA87ULL, K2 = 0xC2B2AE3D27D4EB4FULL;
  uint64_t lane[4] = {seed + K1, seed + K2, seed, seed - K1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      lane[l] = rotl64(lane[l] + w * K2, 31) * K1;
    }
  uint64_t h = fnv1a_bytes(seed ^ static_cast<uint64_t>(n), p + i, n - i);
  for (int l = 0; l < 4; ++l) h = rotl64(h ^ (rotl64(lane[l] * K2, 31) * K1), 27) * K1 + K2;
  h ^= h >> 33, h *= K2, h ^= h >> 29, h *= K1, h ^= h >> 32;
  return h;
}

inline uint64_t sum64_pages(uint64_t h, const uint8_t* p, size_t n) {
  constexpr size_t kPageBytes = 4096;
  for (size_t at = 0; at < n; at += kPageBytes) h = sum64(h, p + at, n - at < kPageBytes ? n - at : kPageBytes);
  return h;
}

}  // namespace jtok
