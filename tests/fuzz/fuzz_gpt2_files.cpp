// GPT-2 tokenizer files: the input is encoder.json, a NUL byte, then vocab.bpe; both loaded, then a
// short text encoded and decoded with the result.
#include <cstring>

#include "data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t a = nul ? static_cast<size_t>(nul - data) : size;
  const std::string enc = jtok::fuzz::write_input(data, a, "encoder.json");
  jtok::fuzz::write_input(nul ? nul + 1 : data + size, nul ? size - a - 1 : 0, "vocab.bpe");
  const std::string dir = enc.substr(0, enc.rfind('/'));
  jtok::fuzz::expect_clean([&] {
    jtok::Tokenizer t = jtok::Tokenizer::load(jtok::TokenizerKind::Gpt2, dir);
    (void)t.decode(t.encode("Hello, world! 123 \xc3\xa9t\xc3\xa9"));
  });
  return 0;
}
