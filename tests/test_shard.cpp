// Shard format: round trip, and clear errors (naming the file) for truncated, foreign, corrupt
// and wrong-tokenizer shards; atomic writes leave no temp files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include "core/error.h"
#include "data/shard.h"
#include "error_test_util.h"

namespace fs = std::filesystem;
using namespace jtok;
using jtok::testing::expect_error;

namespace {
fs::path tmpdir() {
  fs::path d = fs::temp_directory_path() / ("jtok_test_shard_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}
ShardInfo info(uint32_t vocab) {
  ShardInfo i;
  i.vocab_size = vocab;
  i.tokenizer = "gpt2";
  i.tokenizer_fingerprint = 0x1234;
  i.n_documents = 1;
  return i;
}
}  // namespace

TEST(Shard, RoundTrip16And32Bit) {
  auto d = tmpdir();
  std::vector<int32_t> toks{50256, 1, 2, 3, 65535 % 50257, 0};
  write_shard((d / "a.bin").string(), info(50257), toks);
  Shard a((d / "a.bin").string());
  EXPECT_EQ(a.info().token_bytes, 2u);
  EXPECT_EQ(a.size(), toks.size());
  EXPECT_EQ(a.info().tokenizer, "gpt2");
  EXPECT_EQ(a.info().tokenizer_fingerprint, 0x1234u);
  for (size_t i = 0; i < toks.size(); ++i) EXPECT_EQ(a.token(i), uint32_t(toks[i]));
  std::vector<int32_t> big{151643, 151668, 7};
  write_shard((d / "b.bin").string(), info(151669), big);
  Shard b((d / "b.bin").string());
  EXPECT_EQ(b.info().token_bytes, 4u);
  EXPECT_EQ(b.token(1), 151668u);
  EXPECT_EQ(fs::file_size(d / "b.bin"), kShardHeaderBytes + 3 * 4);
  // No temp files left behind.
  for (auto& e : fs::directory_iterator(d)) EXPECT_EQ(e.path().extension(), ".bin") << e.path();
  fs::remove_all(d);
}

TEST(Shard, Truncated) {
  auto d = tmpdir();
  std::string p = (d / "t.bin").string();
  write_shard(p, info(50257), std::vector<int32_t>(100, 5));
  fs::resize_file(p, fs::file_size(p) - 3);
  expect_error([&] { Shard s(p); }, {p, "truncated"});
  fs::resize_file(p, 50);
  expect_error([&] { Shard s(p); }, {p, "truncated"});
  fs::remove_all(d);
}

TEST(Shard, ForeignFile) {
  auto d = tmpdir();
  std::string p = (d / "foreign.bin").string();
  std::ofstream(p) << std::string(400, 'x');
  expect_error([&] { Shard s(p); }, {p, "not a jtok shard"});
  expect_error([&] { Shard s((d / "missing.bin").string()); }, {"missing.bin", "cannot open"});
  fs::remove_all(d);
}

TEST(Shard, CorruptAndVersion) {
  auto d = tmpdir();
  std::string p = (d / "c.bin").string();
  write_shard(p, info(50257), {1, 2, 3, 4});
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kShardHeaderBytes + 2);
    f.put(char(0x7f));
  }
  expect_error([&] { Shard s(p); }, {p, "checksum"});
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.put(char(9));
  }
  expect_error([&] { Shard s(p); }, {p, "version 9"});
  fs::remove_all(d);
}

TEST(Shard, WrongTokenizer) {
  auto d = tmpdir();
  std::string p = (d / "w.bin").string();
  write_shard(p, info(50257), {1, 2});
  Shard s(p);
  EXPECT_NO_THROW(s.check_tokenizer("gpt2", 0x1234));
  expect_error([&] { s.check_tokenizer("qwen3", 0x99); }, {p, "qwen3", "gpt2"});
  expect_error([&] { s.check_tokenizer("gpt2", 0x99); }, {p, "fingerprint"});
  fs::remove_all(d);
}

TEST(Shard, WriteRejectsOutOfVocab) {
  auto d = tmpdir();
  std::string p = (d / "v.bin").string();
  expect_error([&] { write_shard(p, info(100), {1, 100}); }, {p, "100"});
  EXPECT_FALSE(fs::exists(p));
  fs::remove_all(d);
}
