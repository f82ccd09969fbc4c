#include "tokenizer/bpe_files.h"

#include "data/text_inputs.h"

namespace jtok {

PieceCounter count_file_pieces(const std::vector<std::string>& files) {
  PieceCounter counter;
  for (const auto& f : files) counter.add_text(read_input_file(f, "tokenizer train"));
  return counter;
}

TokenizerCheck check_tokenizer_on_files(const Tokenizer& tok, const std::vector<std::string>& files,
                                        const std::function<void(const std::string&)>& not_roundtrip) {
  TokenizerCheck c;
  for (const auto& f : files) {
    std::string text = read_input_file(f, "tokenizer train");
    std::vector<int32_t> ids = tok.encode_parallel(text);
    if (tok.decode(ids) != text && text.find('\0') == std::string::npos) not_roundtrip(f);
    c.tokens += int64_t(ids.size());
    c.bytes += int64_t(text.size());
  }
  return c;
}

}  // namespace jtok
