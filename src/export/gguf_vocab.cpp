#include "export/gguf_vocab.h"

#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_int.h"
#include "data/tokenizer.h"

namespace jtok {

namespace fs = std::filesystem;

namespace {

constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

nlohmann::json parse_json_file(const std::string& path, const char* what) {
  try {
    return nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(what, " ", path, ": ", e.what());
  }
}

// Puts token `tok` of type `type` at id in v (ids outside [0, rows) or taken twice are refused).
void place(GgufVocab& v, int64_t id, const std::string& tok, int32_t type, const std::string& path, int64_t rows) {
  if (id < 0 || id >= rows)
    fail("export gguf: token '", tok, "' of ", path, " has id ", id, ", outside the model's vocab_size ", rows,
         " (its embedding rows); llama.cpp needs one row per token");
  if (v.types[id] != kUnused) fail("export gguf: ", path, ": id ", id, " is given to two tokens");
  v.tokens[id] = tok;
  v.types[id] = type;
}

GgufVocab padded(int64_t rows) {
  GgufVocab v;
  v.tokens.resize(static_cast<size_t>(rows));
  v.types.assign(static_cast<size_t>(rows), kUnused);
  for (int64_t i = 0; i < rows; ++i) v.tokens[i] = "[PAD" + std::to_string(i) + "]";
  return v;
}

// GPT-2: encoder.json (token -> id) and vocab.bpe (merges).
GgufVocab gpt2_vocab(const std::string& dir, int64_t rows) {
  const std::string enc_path = (fs::path(dir) / "encoder.json").string();
  const std::string bpe_path = (fs::path(dir) / "vocab.bpe").string();
  const nlohmann::json enc = parse_json_file(enc_path, "GPT-2 encoder");
  if (!enc.is_object()) fail("GPT-2 encoder ", enc_path, ": expected an object of token -> id");
  GgufVocab v = padded(rows);
  v.pre = "gpt-2";
  for (auto& [tok, idj] : enc.items()) {
    const int64_t id = json_int64(idj).value_or(-1);
    place(v, id, tok, tok == "<|endoftext|>" ? kControl : kNormal, enc_path, rows);
    if (tok == "<|endoftext|>") v.eot = static_cast<int32_t>(id);
  }
  if (v.eot < 0) fail("GPT-2 encoder ", enc_path, ": no <|endoftext|> token");
  v.bos = v.eos = v.eot;
  v.eot = -1;
  std::istringstream in(read_file(bpe_path));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    if (line.find(' ') == std::string::npos) fail("GPT-2 merges ", bpe_path, ": line '", line, "' is not 'a b'");
    v.merges.push_back(line);
  }
  return v;
}

// Qwen2 / Qwen3 / Llama 3: tokenizer.json's model.vocab, model.merges ("a b" or ["a", "b"]) and
// added_tokens (special ones are control tokens, the others user-defined). The special ids come from
// the Tokenizer that jtok itself encodes with, so the GGUF file says what jtok does.
GgufVocab hf_json_vocab(const std::string& name, const std::string& dir, int64_t rows) {
  const std::string path = (fs::path(dir) / "tokenizer.json").string();
  const char* label = name == "llama3" ? "Llama 3 tokenizer" : "Qwen tokenizer";
  const nlohmann::json j = parse_json_file(path, label);
  GgufVocab v = padded(rows);
  v.pre = name == "llama3" ? "llama-bpe" : "qwen2";
  try {
    for (auto& [tok, idj] : j.at("model").at("vocab").items()) place(v, json_int64(idj).value_or(-1), tok, kNormal, path, rows);
    for (const auto& m : j.at("model").at("merges"))
      v.merges.push_back(m.is_array() ? m.at(0).get<std::string>() + " " + m.at(1).get<std::string>()
                                      : m.get<std::string>());
    for (const auto& a : j.at("added_tokens"))
      place(v, json_int64(a.at("id")).value_or(-1), a.at("content").get<std::string>(),
            a.value("special", false) ? kControl : kUserDefined, path, rows);
  } catch (const nlohmann::json::exception& e) {
    fail(label, " ", path, ": missing or malformed field (", e.what(), ")");
  }
  const Tokenizer tok = Tokenizer::load(name, dir);  // its end of text, bos and their checks
  v.eos = tok.eot_id();
  v.bos = tok.bos_id() >= 0 ? tok.bos_id() : v.eos;
  v.add_bos = tok.bos_id() >= 0;
  if (name == "llama3") {
    const int32_t begin = tok.token_id("<|begin_of_text|>");
    if (begin >= 0) v.bos = begin;  // llama.cpp's BOS even when the post-processor adds none
    v.eot = tok.token_id("<|eot_id|>");
  }
  return v;
}

}  // namespace

GgufVocab gguf_vocab(const std::string& name, const std::string& dir, int64_t rows) {
  const std::string d = dir.empty() ? default_tokenizer_dir(name) : dir;
  if (name == "gpt2") return gpt2_vocab(d, rows);
  if (name == "qwen3" || name == "llama3") return hf_json_vocab(name, d, rows);
  fail("export gguf: tokenizer '", name, "' is not supported (gpt2, qwen3, llama3)");
}

}  // namespace jtok
