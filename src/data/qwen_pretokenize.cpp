// Qwen2/Qwen3's Split pattern as a direct matcher (see pretokenize.h for the regex); Llama 3's is
// the same with digits in runs of up to three.
#include "data/pretokenize.h"
#include "data/unicode.h"

namespace jtok {
using namespace unicode;
size_t contraction_at(const std::vector<uint32_t>& c, size_t k, size_t n, bool fold);

void qwen_pretokenize(const CodePoints& t, std::vector<uint32_t>& ends, size_t max_digits) {
  const auto& c = t.cps;
  const auto& cl = t.cls;
  const size_t n = c.size();
  auto crlf = [&](size_t j) { return c[j] == '\r' || c[j] == '\n'; };
  auto other = [&](size_t j) { return (cl[j] & (kLetter | kNumber | kSpace)) == 0; };
  size_t k = 0;
  while (k < n) {
    size_t j = 0;
    if (size_t m = contraction_at(c, k, n, true)) {
      j = k + m;
    } else if ((cl[k] & kLetter) ||
               (!crlf(k) && !(cl[k] & (kLetter | kNumber)) && k + 1 < n && (cl[k + 1] & kLetter))) {
      // [^\r\n\p{L}\p{N}]?\p{L}+
      j = k + 1;
      while (j < n && (cl[j] & kLetter)) ++j;
    } else if (cl[k] & kNumber) {
      j = k + 1;  // \p{N} (Qwen: one digit at a time) or \p{N}{1,3} (Llama 3)
      while (j < n && j - k < max_digits && (cl[j] & kNumber)) ++j;
    } else if (other(k) || (c[k] == ' ' && k + 1 < n && other(k + 1))) {
      // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
      j = (c[k] == ' ') ? k + 1 : k;
      while (j < n && other(j)) ++j;
      while (j < n && crlf(j)) ++j;
    } else {
      // k is whitespace. \s*[\r\n]+ : up to and including the last \r or \n of the run.
      size_t e = k;
      while (e < n && (cl[e] & kSpace)) ++e;
      size_t last_nl = e;
      for (size_t q = e; q > k; --q)
        if (crlf(q - 1)) { last_nl = q - 1; break; }
      if (last_nl < e) j = last_nl + 1;
      else if (e == n) j = n;              // \s+(?!\S)
      else if (e - k >= 2) j = e - 1;      // \s+(?!\S)
      else j = e;                          // \s+
    }
    ends.push_back(t.off[j]);
    k = j;
  }
}

}  // namespace jtok
