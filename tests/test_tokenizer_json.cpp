// data/tokenizer_json: model.vocab and model.merges streamed out of the parse of a tokenizer.json
// (and GPT-2's encoder.json's entries), everything else kept in the tree, malformed shapes left
// for the loader to refuse.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/tokenizer_json.h"

using namespace jtok;
using json = nlohmann::json;

namespace {
// A tokenizer.json's shape, with a "vocab" and a "merges" outside model that must stay in the tree.
const char* kFile = R"({
  "normalizer": {"type": "NFC", "vocab": {"x": 9}},
  "added_tokens": [{"id": 3, "content": "<|e|>"}],
  "merges": ["not a merge"],
  "model": {"type": "BPE", "vocab": {"b": 1, "a": 0, "ab": 2}, "merges": ["a b", ["ab", "a"]], "ignore_merges": true},
  "post_processor": null
})";
}  // namespace

TEST(TokenizerJson, VocabAndMergesStreamedInFileOrderTheRestKept) {
  const TokenizerJson t = parse_tokenizer_json(kFile);
  ASSERT_EQ(t.vocab.size(), 3u);
  EXPECT_EQ(t.vocab[0].first, "b");
  EXPECT_EQ(t.vocab[0].second, 1);
  EXPECT_EQ(t.vocab[1].first, "a");
  EXPECT_EQ(t.vocab[2].first, "ab");
  EXPECT_EQ(t.vocab[2].second, 2);
  ASSERT_EQ(t.merges.size(), 2u);
  EXPECT_EQ(t.merges[0], "a b");
  EXPECT_EQ(t.merges[1], json::array({"ab", "a"}));
  // The tree: the full file but model.vocab's entries and model.merges' items.
  json expect = json::parse(kFile);
  expect["model"]["vocab"] = json::object();
  expect["model"]["merges"] = json::array();
  EXPECT_EQ(t.rest, expect) << t.rest.dump();
}

TEST(TokenizerJson, WithoutVocabOnlyTheTree) {
  const TokenizerJson t = parse_tokenizer_json(kFile, /*keep_vocab=*/false);
  EXPECT_TRUE(t.vocab.empty());
  EXPECT_TRUE(t.merges.empty());
  EXPECT_EQ(t.rest, parse_tokenizer_json(kFile).rest);
}

// Shapes the loader refuses arrive so that it can: a vocab or merges of the wrong kind stays in the
// tree as that kind, an id that is a container is collected as an empty one of its kind.
TEST(TokenizerJson, MalformedShapesReachTheLoader) {
  TokenizerJson t = parse_tokenizer_json(R"({"model": {"vocab": ["a", 0], "merges": {"a": "b"}}})");
  EXPECT_TRUE(t.vocab.empty());
  EXPECT_EQ(t.rest["model"]["vocab"], json::array({"a", 0}));
  EXPECT_TRUE(t.merges.empty());
  EXPECT_EQ(t.rest["model"]["merges"], json({{"a", "b"}}));
  t = parse_tokenizer_json(R"({"model": {"vocab": {"a": {"id": 1}, "b": [2], "c": 3.5, "d": 4}}})");
  ASSERT_EQ(t.vocab.size(), 4u);
  EXPECT_EQ(t.vocab[0].second, json::object());
  EXPECT_EQ(t.vocab[1].second, json::array());
  EXPECT_EQ(t.vocab[2].second, 3.5);
  EXPECT_EQ(t.vocab[3].first, "d");
  EXPECT_EQ(t.vocab[3].second, 4);
  // A model that is an array: nothing collected, the array kept as it was.
  t = parse_tokenizer_json(R"({"x": {"vocab": 1}, "model": [{"vocab": {"a": 0}}]})");
  EXPECT_TRUE(t.vocab.empty());
  EXPECT_EQ(t.rest["model"], json::parse(R"([{"vocab": {"a": 0}}])"));
  EXPECT_THROW(parse_tokenizer_json(R"({"model": {"vocab": {"a": 0,)"), json::exception);
}

TEST(TokenizerJson, EncoderEntriesStreamed) {
  TokenizerJson t = parse_token_ids_json(R"({"!": 0, "\u0120a": 1, "<|endoftext|>": 2})");
  ASSERT_EQ(t.vocab.size(), 3u);
  EXPECT_EQ(t.vocab[1].first,
            "\xc4\xa0"
            "a");
  EXPECT_EQ(t.vocab[2].second, 2);
  EXPECT_EQ(t.rest, json::object());
  t = parse_token_ids_json(R"([0, 1])");  // not an object: kept as it is, for the loader to refuse
  EXPECT_TRUE(t.vocab.empty());
  EXPECT_EQ(t.rest, json::array({0, 1}));
  EXPECT_THROW(parse_token_ids_json("{\"a\": "), json::exception);
}
