// Training our own byte-level BPE (src/tokenizer/bpe_train.h): the incremental trainer equals the
// recount-everything reference, the files load with our GPT-2 loader and round-trip text, training
// is deterministic (independent of the order words were counted in), ties go to the smaller ids,
// compression improves with the vocabulary size, and bad sizes are refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/tokenizer.h"
#include "tokenizer/bpe_train.h"

namespace fs = std::filesystem;
using namespace jtok;

namespace {

std::string root() {
  const char* r = std::getenv("JTOK_ROOT");
  return r ? r : ".";
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Training text: two of the frozen docs in tests/data/corpus; held-out text: a third.
const std::string& train_text() {
  const fs::path corpus = fs::path(root()) / "tests/data/corpus";
  static std::string t = slurp(corpus / "model.md") + slurp(corpus / "jtok.md");
  return t;
}
const std::string& heldout_text() {
  static std::string t = slurp(fs::path(root()) / "tests/data/corpus/data.md");
  return t;
}

std::unordered_map<std::string, int64_t> counts_of(const std::string& text) {
  PieceCounter c;
  c.add_text(text);
  return c.counts();
}

fs::path tmpdir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("jtok_test_bpe_" + name + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

double bytes_per_token(const Tokenizer& t, const std::string& text) {
  return double(text.size()) / double(t.encode(text).size());
}

}  // namespace

TEST(BpeTrain, InputsArePresent) {
  ASSERT_GT(train_text().size(), 10000u) << "tests/data/corpus/model.md + jtok.md under JTOK_ROOT=" << root();
  ASSERT_GT(heldout_text().size(), 2000u);
}

TEST(BpeTrain, IncrementalEqualsReference) {
  const auto counts = counts_of(train_text());
  for (int64_t n : {257, 300, 700}) {
    BpeModel fast = train_bpe(counts, n), ref = train_bpe_reference(counts, n);
    EXPECT_EQ(fast.vocab, ref.vocab) << "vocab_size " << n;
    EXPECT_EQ(fast.merges, ref.merges) << "vocab_size " << n;
    EXPECT_EQ(int64_t(fast.vocab.size()), n);
    EXPECT_EQ(fast.eot_id, n - 1);
  }
}

TEST(BpeTrain, RepeatedRunsAndOrderOfWordsGiveTheSameFiles) {
  const auto counts = counts_of(train_text());
  BpeModel a = train_bpe(counts, 600);
  // The same counts inserted in another order (another hash-table layout).
  std::vector<std::pair<std::string, int64_t>> v(counts.begin(), counts.end());
  std::reverse(v.begin(), v.end());
  std::unordered_map<std::string, int64_t> other(7);
  for (const auto& kv : v) other.insert(kv);
  BpeModel b = train_bpe(other, 600);
  EXPECT_EQ(encoder_json(a), encoder_json(b));
  EXPECT_EQ(vocab_bpe(a), vocab_bpe(b));
}

TEST(BpeTrain, TiesGoToTheSmallerIds) {
  // "cd" and "ab" occur equally often: 'a' (id 64 in GPT-2's byte order) < 'c' (66), so "ab" first.
  BpeModel m = train_bpe({{"cd", 3}, {"ab", 3}, {"x", 1}}, 259);
  ASSERT_EQ(m.merges.size(), 2u);
  EXPECT_EQ(m.vocab[m.merges[0].first], "a");
  EXPECT_EQ(m.vocab[m.merges[0].second], "b");
  EXPECT_EQ(m.vocab[256], "ab");
  EXPECT_EQ(m.vocab[257], "cd");
  // More frequent first, whatever the ids.
  BpeModel f = train_bpe({{"cd", 4}, {"ab", 3}}, 258);
  EXPECT_EQ(f.vocab[256], "cd");
}

TEST(BpeTrain, RunsOutOfPairsGracefully) {
  BpeModel m = train_bpe({{"abc", 2}}, 1000);
  EXPECT_EQ(m.vocab.size(), 256u + 2u + 1u);  // "ab", "abc", <|endoftext|>
  EXPECT_EQ(m.vocab[257], "abc");
}

TEST(BpeTrain, FilesLoadAndRoundTrip) {
  fs::path d = tmpdir("roundtrip");
  BpeModel m = train_bpe(counts_of(train_text()), 512);
  write_gpt2_tokenizer(m, d.string());
  Tokenizer t = Tokenizer::load(TokenizerKind::Gpt2, d.string());
  EXPECT_EQ(t.vocab_size(), 512u);
  EXPECT_EQ(t.eot_id(), 511);
  // The byte tokens have GPT-2's ids.
  for (int32_t id = 0; id < 256; ++id) EXPECT_EQ(t.decode({id}), m.vocab[id]);
  for (const std::string& s : {train_text(), heldout_text(), std::string("naïve café — 東京 🙂\n\t  x'll 12345"),
                               std::string("<|endoftext|> is plain text here")}) {
    std::vector<int32_t> ids = t.encode(s);
    EXPECT_EQ(t.decode(ids), s);
    for (int32_t id : ids) EXPECT_LT(id, 511);
  }
  // A merge made in training is used by the encoder: the most frequent pair encodes as one token.
  std::string first = m.vocab[256];
  EXPECT_EQ(t.encode(first).size(), 1u) << first;
  fs::remove_all(d);
}

TEST(BpeTrain, CompressionImprovesWithVocabularySize) {
  const auto counts = counts_of(train_text());
  double prev_train = 0, prev_held = 0;
  for (int64_t n : {300, 500, 900, 1600}) {  // (our GPT-2 loader wants at least one merge)
    fs::path d = tmpdir(std::to_string(n) + "v");
    write_gpt2_tokenizer(train_bpe(counts, n), d.string());
    Tokenizer t = Tokenizer::load(TokenizerKind::Gpt2, d.string());
    double bt = bytes_per_token(t, train_text()), bh = bytes_per_token(t, heldout_text());
    if (n == 300) {
      EXPECT_GT(bt, 1.2);  // above bytes alone
    } else {
      EXPECT_GT(bt, prev_train * 1.05) << "vocab " << n;
      EXPECT_GT(bh, prev_held * 1.02) << "vocab " << n;
    }
    prev_train = bt;
    prev_held = bh;
    fs::remove_all(d);
  }
  EXPECT_GT(prev_train, 2.5);
}

TEST(BpeTrain, BadSizeIsRefused) {
  try {
    train_bpe({{"ab", 1}}, 256);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
  }
}
