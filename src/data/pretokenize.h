// Pre-tokenizers: split text into the pieces that BPE encodes independently. Each is a
// hand-written matcher equivalent to its regex as JavaScript (flag "u") evaluates it, since the
// JS tokenizers are our references: \s is JS's \s, \p{L}/\p{N} come from node's tables.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

namespace jtok {

// Text as code points with their byte offsets: cps[k] starts at byte off[k]; off[n] = bytes.
struct CodePoints {
  std::vector<uint32_t> cps;
  std::vector<uint32_t> off;
  std::vector<uint8_t> cls;  // unicode::cp_class of each code point
};
// text must be valid UTF-8 (sanitise first).
void to_code_points(std::string_view text, CodePoints& out);

// Appends the end byte offset of each piece to `ends` (pieces cover the text, in order).
// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void gpt2_pretokenize(const CodePoints& text, std::vector<uint32_t>& ends);
// Qwen2/3 (tokenizer.json Split pattern, with (?i:...) for contractions as ASCII case folding):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// max_digits 3: Llama 3's pattern, the same with \p{N}{1,3} for \p{N}.
void qwen_pretokenize(const CodePoints& text, std::vector<uint32_t>& ends, size_t max_digits = 1);

}  // namespace jtok
