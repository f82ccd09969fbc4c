// Qwen3 tokenizer.json (vocab, merges, added tokens): loaded, then a short text encoded and decoded.
#include "data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = jtok::fuzz::write_input(data, size, "tokenizer.json");
  const std::string dir = path.substr(0, path.rfind('/'));
  jtok::fuzz::expect_clean([&] {
    jtok::Tokenizer t = jtok::Tokenizer::load(jtok::TokenizerKind::Qwen3, dir);
    (void)t.decode(t.encode("Hello <|im_start|> world 123"));
  });
  return 0;
}
