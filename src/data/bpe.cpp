// Byte-level BPE merges with a per-thread cache of encoded pieces (text repeats words).
#include "data/bpe.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <iterator>

#include "core/error.h"
#include "data/unicode.h"

namespace jtok {

namespace {
// Byte b <-> code point to_cp[b]: every code point is below 512 (256 + the 68 unprintable bytes).
struct ByteMap {
  static constexpr uint32_t kCodePoints = 512;
  uint32_t to_cp[256];
  int16_t to_byte[kCodePoints];  // -1: no byte
  ByteMap() {
    std::fill(std::begin(to_byte), std::end(to_byte), int16_t(-1));
    uint32_t extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = printable ? uint32_t(b) : 256 + extra++;
      to_byte[to_cp[b]] = int16_t(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}
inline uint64_t mix(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
  return x;
}
constexpr uint64_t kEmpty = ~uint64_t(0);

// Token bytes -> the first id of vocab holding them (Bpe::build's 3 lookups a merge): open
// addressing over (hash tag, id) slots, so that a probe past another token compares no bytes. An
// unordered_map of 150k nodes (allocated, chased, freed) made `jtok tokenize --tokenizer qwen3` of
// one line take 1.4-1.7x the CPU time it takes so (perf stat -r 15, three paired rounds).
class TokenIndex {
 public:
  explicit TokenIndex(const std::vector<std::string>& vocab) : vocab_(vocab) {
    size_t cap = 16;
    while (cap < vocab.size() * 2) cap <<= 1;
    slots_.assign(cap, Slot{0, -1});
    mask_ = cap - 1;
    for (size_t i = 0; i < vocab.size(); ++i)
      if (!vocab[i].empty()) insert(vocab[i], int32_t(i));
  }
  // -1: no token holds these bytes.
  int32_t find(std::string_view bytes) const {
    const uint64_t h = std::hash<std::string_view>{}(bytes);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.tag == uint32_t(h >> 32) && vocab_[size_t(s.id)] == bytes) return s.id;
    }
  }

 private:
  struct Slot {
    uint32_t tag;  // the hash's high half
    int32_t id;    // -1: empty
  };
  void insert(std::string_view bytes, int32_t id) {
    const uint64_t h = std::hash<std::string_view>{}(bytes);
    size_t i = h & mask_;
    for (; slots_[i].id >= 0; i = (i + 1) & mask_)
      if (slots_[i].tag == uint32_t(h >> 32) && vocab_[size_t(slots_[i].id)] == bytes) return;  // the first wins
    slots_[i] = Slot{uint32_t(h >> 32), id};
  }
  const std::vector<std::string>& vocab_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};
}  // namespace

uint32_t byte_to_unicode(uint8_t b) { return byte_map().to_cp[b]; }

bool unicode_token_to_bytes(std::string_view token, std::string& bytes) {
  const auto& m = byte_map();
  bytes.clear();
  size_t i = 0;
  while (i < token.size()) {
    const uint32_t cp = unicode::next_cp(token, i);
    if (cp >= ByteMap::kCodePoints || m.to_byte[cp] < 0) return false;
    bytes += char(m.to_byte[cp]);
  }
  return true;
}

void Bpe::build(std::vector<std::string> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                const std::string& where) {
  static std::atomic<uint64_t> generations{0};
  generation_ = ++generations;
  vocab_ = std::move(vocab);
  const TokenIndex ids(vocab_);
  for (int b = 0; b < 256; ++b) {
    const char byte = char(b);
    byte_id_[b] = ids.find(std::string_view(&byte, 1));
    if (byte_id_[b] < 0) fail(where, ": vocabulary has no token for byte ", b);
  }
  size_t cap = 1;
  while (cap < merges.size() * 2 + 16) cap <<= 1;
  table_.assign(cap, Slot{kEmpty, 0, 0});
  mask_ = cap - 1;
  std::string ab;  // a + b, its buffer reused
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    ab.assign(a).append(b);
    const int32_t ia = ids.find(a), ib = ids.find(b), im = ids.find(ab);
    if (ia < 0 || ib < 0 || im < 0) fail(where, ": merge ", r + 1, " uses a token that is not in the vocabulary");
    uint64_t key = (uint64_t(uint32_t(ia)) << 32) | uint32_t(ib);
    size_t h = mix(key) & mask_;
    while (table_[h].key != kEmpty && table_[h].key != key) h = (h + 1) & mask_;
    if (table_[h].key == key) continue;  // duplicate merge: the first (best) rank wins
    table_[h] = Slot{key, uint32_t(r), im};
  }
}

bool Bpe::find(uint64_t key, uint32_t& rank, int32_t& merged) const {
  size_t h = mix(key) & mask_;
  while (true) {
    const Slot& s = table_[h];
    if (s.key == key) { rank = s.rank; merged = s.merged; return true; }
    if (s.key == kEmpty) return false;
    h = (h + 1) & mask_;
  }
}

void Bpe::encode_uncached(std::string_view piece, std::vector<int32_t>& out) const {
  // syms: current symbols; ranks[i]: rank of merging syms[i] with syms[i+1].
  // O(n^2) in the piece length; pieces are short except long runs, which are rare.
  std::vector<int32_t> syms(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) syms[i] = byte_id_[uint8_t(piece[i])];
  std::vector<uint32_t> ranks(syms.size(), UINT32_MAX);
  std::vector<int32_t> merged(syms.size(), -1);
  auto look = [&](size_t i) {
    uint64_t key = (uint64_t(uint32_t(syms[i])) << 32) | uint32_t(syms[i + 1]);
    uint32_t r; int32_t m;
    if (find(key, r, m)) { ranks[i] = r; merged[i] = m; } else { ranks[i] = UINT32_MAX; }
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i) look(i);
  while (syms.size() > 1) {
    size_t best = 0;
    uint32_t br = UINT32_MAX;
    for (size_t i = 0; i + 1 < syms.size(); ++i)
      if (ranks[i] < br) { br = ranks[i]; best = i; }
    if (br == UINT32_MAX) break;
    syms[best] = merged[best];
    syms.erase(syms.begin() + best + 1);
    ranks.erase(ranks.begin() + best + 1);
    merged.erase(merged.begin() + best + 1);
    if (best + 1 < syms.size()) look(best); else ranks[best] = UINT32_MAX;
    if (best > 0) look(best - 1);
  }
  out.insert(out.end(), syms.begin(), syms.end());
}

namespace {
// Per-thread cache of encoded pieces: open addressing over (hash, key bytes, ids) kept in two
// arenas; cleared wholesale when half full (text repeats a small set of words).
struct PieceCache {
  struct Slot { uint64_t hash; uint32_t key_off, ids_off; uint16_t key_len, ids_len; };
  static constexpr size_t kSlots = 1 << 18;
  std::vector<Slot> slots;
  std::string keys;
  std::vector<int32_t> ids;
  size_t used = 0;
  uint64_t owner = 0;
  void reset(uint64_t who) {
    slots.assign(kSlots, Slot{0, 0, 0, 0, 0});
    keys.clear();
    ids.clear();
    used = 0;
    owner = who;
  }
};
inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  h = (h ^ w) * 0x94d049bb133111ebULL;
  h ^= h >> 29;
  return h | 1;  // 0 marks an empty slot
}
}  // namespace

void Bpe::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) { out.push_back(byte_id_[uint8_t(piece[0])]); return; }
  if (piece.size() > 64) { encode_uncached(piece, out); return; }
  thread_local PieceCache cache;
  if (cache.owner != generation_ || cache.used * 2 > PieceCache::kSlots) cache.reset(generation_);
  uint64_t h = hash_bytes(piece);
  size_t k = h & (PieceCache::kSlots - 1);
  while (true) {
    PieceCache::Slot& s = cache.slots[k];
    if (s.hash == 0) break;
    if (s.hash == h && s.key_len == piece.size() && std::memcmp(cache.keys.data() + s.key_off, piece.data(), piece.size()) == 0) {
      out.insert(out.end(), cache.ids.begin() + s.ids_off, cache.ids.begin() + s.ids_off + s.ids_len);
      return;
    }
    k = (k + 1) & (PieceCache::kSlots - 1);
  }
  size_t start = out.size();
  encode_uncached(piece, out);
  if (cache.keys.size() + piece.size() > UINT32_MAX / 2) return;  // arenas full: skip caching
  cache.slots[k] = PieceCache::Slot{h, uint32_t(cache.keys.size()), uint32_t(cache.ids.size()), uint16_t(piece.size()),
                                    uint16_t(out.size() - start)};
  cache.keys.append(piece);
  cache.ids.insert(cache.ids.end(), out.begin() + start, out.end());
  ++cache.used;
}

}  // namespace jtok
