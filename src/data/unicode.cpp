// UTF-8, character classes and NFC. Classes live in one flat byte table over all code points
// (1.1 MB, built once) so the pre-tokenizers pay one load per character.
#include "data/unicode.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace jtok::unicode {
namespace {
struct CpRange { uint32_t lo, hi; };
struct Decomp { uint32_t cp, offset, len; };
struct CccRank { uint32_t cp; uint8_t rank; };
struct Compose { uint32_t a, b, c; };
#include "data/unicode_tables.inc"

constexpr uint32_t kMaxCp = 0x110000;
constexpr uint32_t kReplacement = 0xFFFD;

const std::vector<uint8_t>& class_vector() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(kMaxCp, 0);
    for (const auto& r : kLetterRanges) for (uint32_t c = r.lo; c <= r.hi; ++c) t[c] |= kLetter;
    for (const auto& r : kNumberRanges) for (uint32_t c = r.lo; c <= r.hi; ++c) t[c] |= kNumber;
    for (const auto& r : kJsSpaceRanges) for (uint32_t c = r.lo; c <= r.hi; ++c) t[c] |= kSpace;
    return t;
  }();
  return table;
}

// NFC lookups, built once.
struct NfcData {
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> decomp;  // cp -> (offset, len)
  std::unordered_map<uint32_t, uint8_t> ccc;                            // cp -> rank (0: starter)
  std::unordered_map<uint64_t, uint32_t> compose;                       // (a<<32|b) -> c
  std::vector<uint8_t> maybe;  // 1 if the cp can decompose, compose with a predecessor, or is a mark
};
const NfcData& nfc_data() {
  static const NfcData d = [] {
    NfcData n;
    n.maybe.assign(kMaxCp, 0);
    for (const auto& x : kDecomps) { n.decomp[x.cp] = {x.offset, x.len}; n.maybe[x.cp] = 1; }
    for (const auto& x : kCccRanks) { n.ccc[x.cp] = x.rank; n.maybe[x.cp] = 1; }
    for (const auto& x : kCompose) { n.compose[(uint64_t(x.a) << 32) | x.b] = x.c; n.maybe[x.b] = 1; }
    for (uint32_t c = 0xAC00; c <= 0xD7A3; ++c) n.maybe[c] = 1;   // Hangul LV/LVT
    for (uint32_t c = 0x1161; c <= 0x11C2; ++c) n.maybe[c] = 1;   // Hangul V and T jamo
    return n;
  }();
  return d;
}

// Hangul constants (Unicode ch. 3.12).
constexpr uint32_t SBase = 0xAC00, LBase = 0x1100, VBase = 0x1161, TBase = 0x11A7;
constexpr uint32_t LCount = 19, VCount = 21, TCount = 28, NCount = VCount * TCount, SCount = LCount * NCount;

uint8_t ccc_of(const NfcData& d, uint32_t cp) {
  auto it = d.ccc.find(cp);
  return it == d.ccc.end() ? 0 : it->second;
}

void decompose(const NfcData& d, uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= SBase && cp < SBase + SCount) {
    uint32_t s = cp - SBase;
    out.push_back(LBase + s / NCount);
    out.push_back(VBase + (s % NCount) / TCount);
    if (s % TCount) out.push_back(TBase + s % TCount);
    return;
  }
  auto it = d.decomp.find(cp);
  if (it == d.decomp.end()) { out.push_back(cp); return; }
  for (uint32_t k = 0; k < it->second.second; ++k) out.push_back(kDecompPool[it->second.first + k]);
}

uint32_t compose_pair(const NfcData& d, uint32_t a, uint32_t b) {
  if (a >= LBase && a < LBase + LCount && b >= VBase && b < VBase + VCount)
    return SBase + ((a - LBase) * VCount + (b - VBase)) * TCount;
  if (a >= SBase && a < SBase + SCount && (a - SBase) % TCount == 0 && b > TBase && b < TBase + TCount)
    return a + (b - TBase);
  auto it = d.compose.find((uint64_t(a) << 32) | b);
  return it == d.compose.end() ? 0 : it->second;
}

// NFC of one run of code points: decompose, reorder marks by ccc, compose (UAX #15).
void nfc_run(const NfcData& d, const std::vector<uint32_t>& in, std::string& out) {
  std::vector<uint32_t> v;
  v.reserve(in.size() + 4);
  for (uint32_t cp : in) decompose(d, cp, v);
  std::vector<uint8_t> cc(v.size());
  for (size_t i = 0; i < v.size(); ++i) cc[i] = ccc_of(d, v[i]);
  // Canonical ordering: stable sort of each maximal run of non-starters.
  for (size_t i = 0; i < v.size();) {
    if (cc[i] == 0) { ++i; continue; }
    size_t j = i;
    while (j < v.size() && cc[j] != 0) ++j;
    for (size_t a = i + 1; a < j; ++a)  // insertion sort, stable
      for (size_t b = a; b > i && cc[b - 1] > cc[b]; --b) { std::swap(v[b - 1], v[b]); std::swap(cc[b - 1], cc[b]); }
    i = j;
  }
  // Canonical composition.
  std::vector<uint32_t> res;
  std::vector<uint8_t> rcc;
  long starter = -1;
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t c = v[i];
    uint8_t k = cc[i];
    if (starter >= 0) {
      uint8_t last = rcc.back();
      bool blocked = (size_t)starter != res.size() - 1 && (last == 0 || last >= k);
      if (!blocked) {
        uint32_t comp = compose_pair(d, res[starter], c);
        if (comp) { res[starter] = comp; continue; }
      }
    }
    if (k == 0) starter = (long)res.size();
    res.push_back(c);
    rcc.push_back(k);
  }
  for (uint32_t c : res) append_utf8(out, c);
}
}  // namespace

uint32_t next_cp(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  unsigned char b0 = p[i];
  if (b0 < 0x80) { ++i; return b0; }
  uint32_t cp;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) { need = 1; cp = b0 & 0x1F; }
  else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2; cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3; cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else { ++i; return kReplacement; }
  size_t j = i + 1;
  for (int k = 0; k < need; ++k, ++j) {
    if (j >= n) { i = j; return kReplacement; }
    unsigned char b = p[j];
    if (b < lo || b > hi) { i = j; return kReplacement; }  // maximal subpart ends before b
    lo = 0x80; hi = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
  }
  i = j;
  return cp;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if ((unsigned char)s[i] < 0x80) { ++i; continue; }
    size_t start = i;
    uint32_t cp = next_cp(s, i);
    if (cp == kReplacement && !(i - start == 3 && (unsigned char)s[start] == 0xEF)) return false;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 16);
  size_t i = 0;
  while (i < s.size()) append_utf8(out, next_cp(s, i));
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) out += char(cp);
  else if (cp < 0x800) { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
  else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18)); out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F));
  }
}

uint8_t cp_class(uint32_t cp) {
  static const uint8_t* t = class_vector().data();
  return cp < kMaxCp ? t[cp] : 0;
}

std::string nfc(std::string_view s) {
  const NfcData& d = nfc_data();
  // Quick check: nothing that may change -> copy.
  bool any = false;
  for (size_t i = 0; i < s.size() && !any;) {
    if ((unsigned char)s[i] < 0x80) { ++i; continue; }
    any = d.maybe[next_cp(s, i)];
  }
  if (!any) return std::string(s);
  // Normalise run by run: a run starts at a code point that is a starter and cannot compose
  // with what precedes it, so runs are independent.
  std::string out;
  out.reserve(s.size());
  std::vector<uint32_t> run;
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp = next_cp(s, i);
    if (!run.empty() && !d.maybe[cp]) { nfc_run(d, run, out); run.clear(); }
    run.push_back(cp);
  }
  if (!run.empty()) nfc_run(d, run, out);
  return out;
}

const uint8_t* class_table() { return class_vector().data(); }

const char* unicode_version() { return JTOK_UNICODE_VERSION; }

}  // namespace jtok::unicode
