// `jtok prepare`'s steps (data/prepare.h): the token stream of documents (eot before each, the
// same ids whether a long document is encoded whole or in chunks) and the shards written from it
// (sizes, document counts, the leftovers of earlier runs removed).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "data/prepare.h"
#include "data/shard.h"
#include "temp_dir.h"

using namespace jtok;
namespace fs = std::filesystem;

namespace {
// The 512-token BPE of the bit-identity test (GPT-2 format, no bos token).
const Tokenizer& small_bpe() {
  static Tokenizer t = Tokenizer::load("gpt2", std::string(std::getenv("JTOK_ROOT")) + "/tests/data/bit_identity");
  return t;
}

std::vector<int32_t> shard_tokens(const std::string& path) {
  Shard s(path);
  std::vector<int32_t> out;
  for (uint64_t i = 0; i < s.size(); ++i) out.push_back(static_cast<int32_t>(s.token(i)));
  return out;
}

void touch(const fs::path& p) { std::ofstream(p) << "x"; }
}  // namespace

TEST(Prepare, StreamIsEotThenEachDocumentsIds) {
  const Tokenizer& tok = small_bpe();
  ASSERT_LT(tok.bos_id(), 0);
  const std::vector<std::string> docs = {"Hello world.\n", "", "A second document, longer than the first.\n"};
  std::vector<int32_t> want;
  for (const auto& d : docs) {
    want.push_back(tok.eot_id());
    tok.encode(d, want);
  }
  EXPECT_EQ(tokenize_documents(tok, docs), want);
}

TEST(Prepare, LongDocumentInChunksGivesTheWholeDocumentsIds) {
  const Tokenizer& tok = small_bpe();
  std::string book;
  for (int i = 0; book.size() < 300000; ++i) book += "Line " + std::to_string(i) + " of the book, with words.\nAnd more";
  ASSERT_GT(safe_chunk_bounds(book, 1 << 16).size(), 3u);  // really cut into several chunks
  std::vector<int32_t> want = {tok.eot_id()};
  tok.encode(book, want);
  EXPECT_EQ(tokenize_documents(tok, {book}), want);
}

TEST(Prepare, ShardsHoldTheStreamAndLeftoversAreRemoved) {
  const Tokenizer& tok = small_bpe();
  const fs::path out = jtok::testing::fresh_temp_dir("prepare_shards");
  fs::create_directories(out);
  for (const char* f : {"p_000003.bin", "p_000004.bin", "p_000006.bin", ".p_000001.bin.tmp-99", "q_000000.bin"})
    touch(out / f);
  std::vector<int32_t> stream;
  for (int i = 0; i < 25; ++i) stream.push_back(i % 7 == 0 ? tok.eot_id() : i);
  EXPECT_EQ(write_token_shards(tok, stream, out.string(), "p", 10), 3u);
  std::vector<int32_t> got;
  const uint64_t docs[3] = {2, 1, 1};  // eot at 0, 7 | 14 | 21
  for (int k = 0; k < 3; ++k) {
    const std::string path = (out / ("p_00000" + std::to_string(k) + ".bin")).string();
    const auto t = shard_tokens(path);
    EXPECT_EQ(t.size(), k < 2 ? 10u : 5u);
    EXPECT_EQ(Shard(path).info().n_documents, docs[k]);
    got.insert(got.end(), t.begin(), t.end());
  }
  EXPECT_EQ(got, stream);
  EXPECT_FALSE(fs::exists(out / "p_000003.bin"));       // stale shards of a larger run
  EXPECT_FALSE(fs::exists(out / "p_000004.bin"));
  EXPECT_TRUE(fs::exists(out / "p_000006.bin"));        // after a gap: not this prefix's sequence
  EXPECT_FALSE(fs::exists(out / ".p_000001.bin.tmp-99"));  // a killed run's temp file
  EXPECT_TRUE(fs::exists(out / "q_000000.bin"));        // another prefix
}

TEST(Prepare, EmptyStreamIsOneEmptyShard) {
  const fs::path out = jtok::testing::fresh_temp_dir("prepare_empty");
  EXPECT_EQ(write_token_shards(small_bpe(), {}, out.string(), "s", 10), 1u);
  EXPECT_EQ(Shard((out / "s_000000.bin").string()).size(), 0u);
}
