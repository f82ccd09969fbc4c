#include "hf/hf_tokenizer.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_json.h"

namespace jtok {

namespace {

using json = nlohmann::json;

// Llama 3's split pattern: Qwen2's with \p{N}{1,3} (digits in groups of up to three) for \p{N}.
const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// What the pre_tokenizer object says, in a few words for an error message.
std::string describe_pre_tokenizer(const json& pre) {
  if (!pre.is_object()) return pre.dump();
  const std::string type = pre.value("type", std::string("?"));
  if (type != "Sequence") return "type " + type;
  std::string out = "Sequence [";
  for (const json& p : pre.value("pretokenizers", json::array())) {
    out += p.value("type", std::string("?"));
    if (p.contains("pattern") && p.at("pattern").is_object() && p.at("pattern").contains("Regex"))
      out += " /" + p.at("pattern").at("Regex").get<std::string>() + "/";
    out += ", ";
  }
  return out + "]";
}

// The kind of dir/tokenizer.json (see hf_tokenizer_kind); json::exception escapes for a field of
// an unexpected type.
std::string kind_of(const std::string& dir, int64_t model_vocab) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer.json").string();
  std::string said;
  {  // the small parts only (no vocabulary or merges): the loader below reads the file whole
    json j;
    try {
      j = parse_tokenizer_json(read_file(path), /*keep_vocab=*/false).rest;
    } catch (const json::exception& e) {
      fail("tokenizer ", path, " does not parse: ", e.what());
    }
    if (!j.is_object()) fail("tokenizer ", path, ": expected a JSON object");
    const std::string type = j.contains("model") ? j.at("model").value("type", std::string("?")) : "?";
    if (type != "BPE") fail("tokenizer ", path, ": model type '", type, "' is not implemented (byte-level BPE only)");
    said = describe_pre_tokenizer(j.value("pre_tokenizer", json()));
  }
  const bool llama3 = said.find(kLlama3Pattern) != std::string::npos;
  uint32_t ids = 0;
  try {  // every check of the loader (pattern, normalizer, vocabulary, merges, end-of-text token)
    ids = Tokenizer::load(llama3 ? TokenizerKind::Llama3 : TokenizerKind::Qwen3, dir).vocab_size();
  } catch (const Error& e) {
    fail(e.what(), " (its pre_tokenizer: ", said, ")");
  }
  if (model_vocab > 0 && static_cast<int64_t>(ids) > model_vocab)
    fail("tokenizer ", path, " has ", ids, " token ids, more than the model's ", model_vocab, " embedding rows (vocab_size)");
  return llama3 ? "llama3" : "qwen3";
}

}  // namespace

std::string hf_tokenizer_kind(const std::string& dir, int64_t model_vocab) {
  try {
    return kind_of(dir, model_vocab);
  } catch (const json::exception& e) {  // a field of an unexpected type
    fail("tokenizer ", (std::filesystem::path(dir) / "tokenizer.json").string(), ": malformed field (", e.what(), ")");
  }
}

}  // namespace jtok
