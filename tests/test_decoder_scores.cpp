// infer/decoder_scores.h on the CPU decoder against the CPU's forward path (infer/text_scores.h):
// per-token log-probs within 1e-5 (absolute), one-shot and in pieces of 1, 3 and 7 tokens, with
// an f32 KV cache; sequences of 0, 1 and 2 tokens; a sequence is closed again after its scores
// and after a callback that throws (the next open gets the same handle back).
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "infer/decoder_scores.h"
#include "infer/text_scores.h"
#include "model_test_util.h"

using namespace jtok;
using namespace jtok::testing;

namespace {

Model test_model() {
  TinyJtokShape s;
  s.layers = 3;
  s.jtok_layers = "0,2";
  s.jtokm_layers = "1-2";
  return make_model(tiny_jtok_config(s), 11);
}

std::vector<std::vector<int32_t>> sequences(int64_t V) {
  std::vector<std::vector<int32_t>> ids = {{}, {5}, {5, 9}};
  for (int64_t len : {17, 30, 48}) {
    std::vector<int32_t> s;
    for (int64_t j = 0; j < len; ++j) s.push_back(static_cast<int32_t>((len * 13 + j * 29 + 1) % V));
    ids.push_back(s);
  }
  return ids;
}

}  // namespace

TEST(DecoderScores, TokenLogprobsMatchTheForward) {
  const Model m = test_model();
  const auto ids = sequences(m.cfg.vocab_size);
  const auto want = sequence_token_logprobs(m, ids, 2);
  for (int64_t piece : {1, 3, 7, 512}) {
    auto dec = make_cpu_decoder(m, false);
    const auto got = decoder_token_logprobs({*dec, piece, m.cfg.vocab_size}, ids);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(got[i].size(), want[i].size()) << "sequence " << i << ", pieces of " << piece;
      for (size_t t = 0; t < got[i].size(); ++t)
        EXPECT_NEAR(got[i][t], want[i][t], 1e-5) << "sequence " << i << " token " << t << ", pieces of " << piece;
    }
    EXPECT_EQ(dec->open(4), 0) << "a scored sequence was left open";
  }
}

TEST(DecoderScores, ClosesTheSequenceWhenTheCallbackThrows) {
  const Model m = test_model();
  auto dec = make_cpu_decoder(m, false);
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6};
  const DecoderScorer sc{*dec, 2, m.cfg.vocab_size};
  int64_t calls = 0;
  EXPECT_THROW(sequence_logits(sc, ids.data(), 6, [&](int64_t, int64_t, const float*) {
                 if (++calls == 2) throw std::runtime_error("stop");
               }),
               std::runtime_error);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(dec->open(4), 0);
  EXPECT_THROW(sequence_logits(sc, ids.data(), 0, {}), Error);
}
