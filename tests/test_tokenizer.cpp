// Tokenizer unit tests: known ids, special-token handling, NFC, parallel == serial encoding,
// round trip, and clear errors for missing or corrupt vocabulary files. The full parity check
// against the JS references is tests/test_tokenizer_parity.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/bpe.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "error_test_util.h"

namespace fs = std::filesystem;
using namespace jtok;
using jtok::testing::expect_error;

namespace {
const Tokenizer& gpt2() { static Tokenizer t = Tokenizer::load("gpt2"); return t; }
const Tokenizer& qwen3() { static Tokenizer t = Tokenizer::load("qwen3"); return t; }
std::vector<int32_t> ids(std::initializer_list<int32_t> l) { return l; }
fs::path tmpdir(const char* name) {
  fs::path d = fs::temp_directory_path() / (std::string("jtok_test_tok_") + name + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}
}  // namespace

// Bpe::build on a small vocabulary: the 256 bytes (id = byte) then "ab", "abc", "ab" again (its first
// id, 256, is the one merges make); merges by rank; a missing byte or merge token named.
TEST(Bpe, BuildsItsIndexAndNamesWhatIsMissing) {
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(1, char(b));
  vocab.insert(vocab.end(), {"ab", "abc", "ab"});
  Bpe bpe;
  bpe.build(vocab, {{"a", "b"}, {"ab", "c"}}, "tiny");
  std::vector<int32_t> out;
  bpe.encode_piece("abcab", out);
  EXPECT_EQ(out, ids({257, 256}));
  out.clear();
  bpe.encode_piece("ba", out);
  EXPECT_EQ(out, ids({'b', 'a'}));
  expect_error(
      [&] {
        bpe.build(vocab, {{"a", "b"}, {"ab", "cd"}}, "tiny");
      },
      {"tiny: merge 2 uses a token that is not in the vocabulary"});
  vocab[7].clear();
  expect_error([&] { bpe.build(vocab, {}, "tiny"); }, {"tiny: vocabulary has no token for byte 7"});
}

TEST(Tokenizer, Gpt2KnownIds) {
  // Reference ids from gpt-tokenizer@4.0.0 (r50k_base).
  EXPECT_EQ(gpt2().encode("Hello world"), ids({15496, 995}));
  EXPECT_EQ(gpt2().encode(""), ids({}));
  EXPECT_EQ(gpt2().vocab_size(), 50257u);
  EXPECT_EQ(gpt2().eot_id(), 50256);
  // "<|endoftext|>" in text is plain text for GPT-2; decode of the id gives it back.
  EXPECT_NE(gpt2().encode("<|endoftext|>"), ids({50256}));
  EXPECT_EQ(gpt2().decode({50256}), "<|endoftext|>");
}

TEST(Tokenizer, Qwen3AddedTokensAndNfc) {
  EXPECT_EQ(qwen3().vocab_size(), 151669u);
  EXPECT_EQ(qwen3().eot_id(), 151643);
  auto v = qwen3().encode("<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(v.front(), 151644);
  EXPECT_EQ(v.back(), 151645);
  // Decomposed e + combining acute encodes like the precomposed e-acute.
  EXPECT_EQ(qwen3().encode("caf\x65\xcc\x81"), qwen3().encode("caf\xc3\xa9"));
  EXPECT_EQ(unicode::nfc("\xe1\xb8\x8b\xcc\xa3"), "\xe1\xb8\x8d\xcc\x87");  // d+dot above+dot below
  EXPECT_EQ(unicode::nfc("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8"), "\xea\xb0\x81");  // Hangul jamo -> syllable
}

TEST(Tokenizer, ParallelEqualsSerialAndRoundTrips) {
  std::string text;
  for (int i = 0; i < 4000; ++i)
    text += "Line " + std::to_string(i) + ": it's  a test\n\n  of chunks, \xe4\xbd\xa0\xe5\xa5\xbd!\nNext one\n";
  for (const Tokenizer* t : {&gpt2(), &qwen3()}) {
    auto a = t->encode(text);
    auto b = t->encode_parallel(text, 2);
    EXPECT_EQ(a, b) << t->name();
    EXPECT_EQ(t->decode(a), text) << t->name();
  }
}

TEST(Tokenizer, InvalidUtf8BecomesReplacementChar) {
  // Like node's UTF-8 decoder: each maximal invalid subpart -> U+FFFD.
  EXPECT_EQ(unicode::sanitize_utf8("a\xff" "b\xe2\x82" "c"), "a\xef\xbf\xbd" "b\xef\xbf\xbd" "c");
  EXPECT_EQ(gpt2().encode("a\xff"), gpt2().encode("a\xef\xbf\xbd"));
}

TEST(Tokenizer, DecodeRejectsOutOfVocab) {
  expect_error([] { gpt2().decode({50257}); }, {"50257", "gpt2"});
}

TEST(Tokenizer, MissingOrCorruptFilesNameTheFile) {
  fs::path d = tmpdir("bad");
  expect_error([&] { Tokenizer::load(TokenizerKind::Gpt2, d.string()); }, {(d / "encoder.json").string(), "cannot open"});
  std::ofstream(d / "encoder.json") << "{\"a\": 0, \"b\": ";  // truncated JSON
  expect_error([&] { Tokenizer::load(TokenizerKind::Gpt2, d.string()); }, {(d / "encoder.json").string(), "JSON"});
  // Valid encoder, missing merges.
  fs::copy_file(fs::path(default_tokenizer_dir("gpt2")) / "encoder.json", d / "encoder.json",
                fs::copy_options::overwrite_existing);
  expect_error([&] { Tokenizer::load(TokenizerKind::Gpt2, d.string()); }, {(d / "vocab.bpe").string()});
  std::ofstream(d / "vocab.bpe") << "#version: 0.2\nthis line is bad\n";
  expect_error([&] { Tokenizer::load(TokenizerKind::Gpt2, d.string()); }, {(d / "vocab.bpe").string(), "line 2"});
  std::ofstream(d / "tokenizer.json") << "{\"model\": {}}";
  expect_error([&] { Tokenizer::load(TokenizerKind::Qwen3, d.string()); }, {(d / "tokenizer.json").string()});
  expect_error([&] { Tokenizer::load("bert"); }, {"bert"});
  fs::remove_all(d);
}

// A GPT-2 encoder.json whose token id is a float, negative or past int64 (2^64 - 1 once read as -1):
// each named in a clear error with the token.
TEST(Tokenizer, Gpt2BadTokenIdsAreNamed) {
  std::ifstream in(fs::path(default_tokenizer_dir("gpt2")) / "encoder.json");
  std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(good.rfind("{\"!\": 0,", 0), 0u) << "the GPT-2 encoder starts with '!' = 0";
  fs::path d = tmpdir("gpt2_ids");
  const fs::path enc = d / "encoder.json";
  struct Case { const char* id; const char* says; };
  for (const Case& c : {Case{"18446744073709551615", "id 18446744073709551615 of '!' is out of range [0, 50257)"},
                        Case{"-3", "id -3 of '!' is out of range"}, Case{"50257", "id 50257 of '!' is out of range"},
                        Case{"1.0", "id of '!' is not an integer"}, Case{"\"0\"", "id of '!' is not an integer"}}) {
    std::ofstream(enc, std::ios::trunc) << "{\"!\": " << c.id << good.substr(good.find(','));
    expect_error([&] { Tokenizer::load(TokenizerKind::Gpt2, d.string()); }, {enc.string(), c.says});
  }
  fs::remove_all(d);
}

// A Qwen3 tokenizer.json whose token ids are floats, negative or huge: each named in a clear error
// (the fuzzer found a float id 5.6e101 converted to size_t, undefined behaviour).
TEST(Tokenizer, Qwen3BadTokenIdsAreNamed) {
  const char* root = std::getenv("JTOK_ROOT");
  ASSERT_NE(root, nullptr) << "JTOK_ROOT (set by ctest) names the source tree";
  const fs::path seed = fs::path(root) / "tests/fuzz/corpus/fuzz_qwen_tokenizer_json/small.json";
  std::ifstream in(seed);
  std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_NE(good.find("\"\\u0101\": 1,"), std::string::npos) << seed;
  fs::path d = tmpdir("qwen_ids");
  std::ofstream(d / "tokenizer.json") << good;
  EXPECT_NO_THROW(Tokenizer::load(TokenizerKind::Qwen3, d.string()));
  for (const char* bad : {"5.55556e+101", "1.5", "-3", "18446744073709551615", "20000000", "\"7\""}) {
    std::string s = good;
    s.replace(s.find("\"\\u0101\": 1,"), std::string("\"\\u0101\": 1,").size(), std::string("\"\\u0101\": ") + bad + ",");
    std::ofstream(d / "tokenizer.json", std::ios::trunc) << s;
    expect_error([&] { Tokenizer::load(TokenizerKind::Qwen3, d.string()); }, {(d / "tokenizer.json").string()});
  }
  fs::remove_all(d);
}
