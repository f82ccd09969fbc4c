// BPE training over text files (`jtok tokenizer train`): the pieces of every file counted, and the
// trained tokenizer checked on the same files (bytes per token, byte-for-byte round trip).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "tokenizer/bpe_train.h"

namespace jtok {

// GPT-2 pre-tokenizer pieces of every file, counted (a file that cannot be read fails naming it).
PieceCounter count_file_pieces(const std::vector<std::string>& files);

struct TokenizerCheck {
  int64_t tokens = 0, bytes = 0;  // over all files: bytes per token = bytes / tokens
};
// Encodes every file with tok and decodes it back; not_roundtrip(path) is called, in file order,
// for a file without NUL bytes whose decoded bytes differ from its own (decode gives bytes; invalid
// UTF-8 in the input is replaced by U+FFFD before encoding).
TokenizerCheck check_tokenizer_on_files(const Tokenizer& tok, const std::vector<std::string>& files,
                                        const std::function<void(const std::string&)>& not_roundtrip);

}  // namespace jtok
