// Tokenizer input text: GPT-2 and Qwen3 encode any bytes; GPT-2's decode gives back the text with
// invalid UTF-8 replaced by U+FFFD (a byte-level BPE loses nothing else), and the parallel encoder
// gives the same ids as the serial one.
#include <cstdlib>

#include "data/tokenizer.h"
#include "data/unicode.h"
#include "fuzz_util.h"

static const jtok::Tokenizer* gpt2_tok = nullptr;
static const jtok::Tokenizer* qwen_tok = nullptr;

// Loading the real vocabularies takes seconds under ASan: done once before any input is timed.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gpt2_tok = new jtok::Tokenizer(jtok::Tokenizer::load("gpt2"));
  qwen_tok = new jtok::Tokenizer(jtok::Tokenizer::load("qwen3"));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const jtok::Tokenizer& gpt2 = *gpt2_tok;
  const jtok::Tokenizer& qwen = *qwen_tok;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = gpt2.encode(text);
  if (gpt2.decode(ids) != jtok::unicode::sanitize_utf8(text)) std::abort();  // round trip
  if (gpt2.encode_parallel(text, 2) != ids) std::abort();
  const std::vector<int32_t> q = qwen.encode(text);
  (void)qwen.decode(q);
  return 0;
}
