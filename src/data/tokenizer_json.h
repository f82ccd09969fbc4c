// A Hugging Face tokenizer.json (and GPT-2's encoder.json) read in one pass, the large parts
// streamed out of the parse.
// A 150k-token file is ~11 MB; parsed whole, model.vocab becomes a std::map of 150k strings, and
// building and freeing that tree is most of a load's time (Qwen3's: 0.55 s a load, 0.32 s so). Here the
// parser's callback takes model.vocab's entries and model.merges' items as they are read and drops
// them from the tree, so the tree holds only the small parts (normalizer, pre_tokenizer,
// added_tokens, post_processor, model.type, ...), with model.vocab {} and model.merges [] left
// empty in it (a missing field stays missing).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace jtok {

struct TokenizerJson {
  nlohmann::json rest;  // the file but model.vocab's entries and model.merges' items
  std::vector<std::pair<std::string, nlohmann::json>> vocab;  // model.vocab's token -> id, file order
  std::vector<nlohmann::json> merges;                         // model.merges' items, "a b" or ["a", "b"]
};

// Parses text; with keep_vocab false, vocab and merges are dropped uncollected (for a caller that
// reads only the small parts). Throws nlohmann::json::exception for text that is not JSON. An id
// that is an object or array is collected as an empty one of its kind (the loader names it).
TokenizerJson parse_tokenizer_json(const std::string& text, bool keep_vocab = true);
// GPT-2's encoder.json, a root object of token -> id, the same way: its entries in vocab, rest the
// root left empty. A vocabulary that is not an object (here or in model.vocab) stays in the tree as
// it is, nothing collected from it.
TokenizerJson parse_token_ids_json(const std::string& text);

}  // namespace jtok
