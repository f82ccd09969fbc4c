// A tokenizer as llama.cpp reads it from a GGUF file (tokenizer.ggml.*): token strings in id order,
// spelled byte-level as in the tokenizer's own files, their types, the merges "a b" in rank order,
// and the pre-tokenizer's llama.cpp name.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace jtok {

struct GgufVocab {
  std::vector<std::string> tokens, merges;
  std::vector<int32_t> types;  // llama_token_type: 1 normal, 3 control, 4 user-defined, 5 unused
  std::string pre;             // tokenizer.ggml.pre: "gpt-2", "qwen2" or "llama-bpe" (Llama 3)
  int32_t bos = -1, eos = -1;  // GPT-2, Qwen: both <|endoftext|>; Llama 3: <|begin_of_text|>, <|end_of_text|>
  int32_t eot = -1;            // Llama 3's end of turn <|eot_id|> (-1: none)
  bool add_bos = false;        // the tokenizer puts bos before a text (tokenizer.json's post_processor)
};

// The tokenizer `name` ("gpt2", "qwen3" or "llama3") of dir (empty: default_tokenizer_dir(name)), with exactly
// `rows` tokens, one per row of the model's embedding: ids the tokenizer does not use (a gap, or past
// its last id) become "[PAD<id>]" of type unused, as llama.cpp's converter writes them. A model with
// fewer rows than the tokenizer has ids is refused. Errors name the file.
GgufVocab gguf_vocab(const std::string& name, const std::string& dir, int64_t rows);

}  // namespace jtok
