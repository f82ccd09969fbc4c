// GPT-2's pre-tokenization regex as a direct matcher (the alternatives are tried in order at
// each position, like the regex engine would; no backtracking is needed beyond \s+(?!\S)).
#include "data/pretokenize.h"
#include "data/unicode.h"

namespace jtok {
using namespace unicode;

void to_code_points(std::string_view text, CodePoints& out) {
  out.cps.clear(); out.off.clear(); out.cls.clear();
  out.cps.reserve(text.size()); out.off.reserve(text.size() + 1); out.cls.reserve(text.size());
  const uint8_t* table = class_table();
  size_t i = 0;
  while (i < text.size()) {
    out.off.push_back(uint32_t(i));
    unsigned char b = text[i];
    uint32_t cp = b < 0x80 ? (++i, b) : next_cp(text, i);  // ASCII needs no decoding
    out.cps.push_back(cp);
    out.cls.push_back(table[cp]);
  }
  out.off.push_back(uint32_t(text.size()));
}

namespace {
// Length of a contraction 's 't 're 've 'm 'll 'd at k (0: none). fold: ASCII case-insensitive.
inline size_t contraction(const std::vector<uint32_t>& c, size_t k, size_t n, bool fold) {
  if (c[k] != '\'' || k + 1 >= n) return 0;
  auto low = [&](size_t j) -> uint32_t {
    uint32_t x = c[j];
    return (fold && x >= 'A' && x <= 'Z') ? x + 32 : x;
  };
  uint32_t a = low(k + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (k + 2 < n) {
    uint32_t b = low(k + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  return 0;
}
}  // namespace

size_t contraction_at(const std::vector<uint32_t>& c, size_t k, size_t n, bool fold) {
  return contraction(c, k, n, fold);
}

void gpt2_pretokenize(const CodePoints& t, std::vector<uint32_t>& ends) {
  const auto& c = t.cps;
  const auto& cl = t.cls;
  const size_t n = c.size();
  auto other = [&](size_t j) { return (cl[j] & (kLetter | kNumber | kSpace)) == 0; };
  size_t k = 0;
  while (k < n) {
    size_t j = k;
    if (size_t m = contraction(c, k, n, false)) {
      j = k + m;
    } else {
      // ' ?X+' for X in letters, numbers, others: the optional space joins a following run.
      size_t s = (c[k] == ' ' && k + 1 < n) ? k + 1 : k;
      uint8_t want = 0;
      if (cl[s] & kLetter) want = kLetter;
      else if (cl[s] & kNumber) want = kNumber;
      if (want) {
        j = s + 1;
        while (j < n && (cl[j] & want)) ++j;
      } else if (other(s)) {
        j = s + 1;
        while (j < n && other(j)) ++j;
      } else {
        // k is whitespace (a space followed by whitespace, or any \s).
        size_t e = k;
        while (e < n && (cl[e] & kSpace)) ++e;
        if (e == n) j = n;                  // \s+(?!\S) at the end
        else if (e - k >= 2) j = e - 1;     // \s+(?!\S): leave the last space to the next word
        else j = e;                         // \s+
      }
    }
    ends.push_back(t.off[j]);
    k = j;
  }
}

}  // namespace jtok
