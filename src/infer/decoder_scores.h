// `jtok eval`'s scores through a Decoder (infer/decoder.h): `--device cuda`, and the CPU decoder
// under --score-through-decoder (the same path, checked in CI against the CPU's forward). Every
// mode stands on sequence_logits: a sequence of tokens is opened with room for all of them,
// prefilled in pieces of at most `piece` tokens with every position's logits handed over
// (PositionLogits), and closed; the log-softmax is taken on the host by ops/cross_entropy.h, as the
// CPU's forward path (infer/validation.h, infer/text_scores.h) takes it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/tokenizer.h"
#include "infer/decoder.h"
#include "infer/validation.h"

namespace jtok {

struct DecoderScorer {
  Decoder& dec;
  int64_t piece;       // tokens a prefill call takes at most (the decoder's max_prefill)
  int64_t vocab_size;  // V: columns of the decoder's logits
};

// Every position's logits of ids[0..n) (row t predicts the token after ids[t]) handed to each, in
// order, in the decoder's blocks; the sequence is closed again (also when each throws).
void sequence_logits(const DecoderScorer& sc, const int32_t* ids, int64_t n, const PositionLogits& each);

// sequence_token_logprobs through the decoder: log p(ids[t] | ids[0..t)) for t = 1.. of each
// sequence (size - 1 values; none for a sequence of fewer than 2 tokens).
std::vector<std::vector<float>> decoder_token_logprobs(const DecoderScorer& sc,
                                                       const std::vector<std::vector<int32_t>>& ids);

// score_texts through the decoder: each text's total log-probability (scored_text_ids' tokens).
std::vector<double> decoder_score_texts(const DecoderScorer& sc, const Tokenizer& tok,
                                        const std::vector<std::string>& texts, int64_t max_positions);

// validation_sums with the decoder's logits as the model under test: each batch's rows are
// sequences of T tokens, a batch's loss the mean cross-entropy of its B x T positions. ref (when
// not null) runs on the CPU's forward as in validation_sums, its vocabulary the decoder's.
ValidationSums decoder_validation_sums(const DecoderScorer& sc, const Model* ref, const ValidationSet& val, int64_t nb);

}  // namespace jtok
