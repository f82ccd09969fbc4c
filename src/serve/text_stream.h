// Completion text as tokens arrive: whole UTF-8 characters only, cut at the first stop sequence.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace jtok {

// The longest prefix of s[0, n) that does not end inside a UTF-8 character (a token may carry half
// of one; the rest comes with the next token).
size_t utf8_complete(const std::string& s, size_t n);

// Turns a sequence's tokens into text as they come: holds back a partial UTF-8 character and any
// tail that may begin a stop sequence; cuts at the first stop sequence.
struct TextTracker {
  const Tokenizer& tok;
  const std::vector<std::string>& stops;
  size_t sent = 0;       // bytes of text already handed out
  bool stopped = false;  // a stop sequence was seen
  // Returns the new text that may be sent now; `done`: the sequence has ended.
  std::string advance(const std::vector<int32_t>& tokens, bool done);
};

}  // namespace jtok
