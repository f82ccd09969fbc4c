#include "serve/text_stream.h"

#include <algorithm>

namespace jtok {

size_t utf8_complete(const std::string& s, size_t n) {
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > back ? n - back : n;
  }
  return n;
}

std::string TextTracker::advance(const std::vector<int32_t>& tokens, bool done) {
  std::string text = tok.decode(tokens);
  size_t end = text.size();
  size_t cut = std::string::npos;
  for (const auto& s : stops) cut = std::min(cut, text.find(s));
  if (cut != std::string::npos) {
    stopped = true;
    end = cut;
  } else if (!done) {
    size_t hold = 0;
    for (const auto& s : stops) hold = std::max(hold, s.size() - 1);
    end = end > hold ? end - hold : 0;
    end = utf8_complete(text, end);
  }
  if (end <= sent) return {};
  std::string out = text.substr(sent, end - sent);
  sent = end;
  return out;
}

}  // namespace jtok
