// Log-probabilities of whole texts under a model (`jtok eval`: BLiMP's sentences, --token-logprobs):
// each text scored as [eot] + its tokens ([bos] + tokens with a tokenizer that puts one before
// every text, as Hugging Face's encode does), cut to the model's context.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/transformer.h"

namespace jtok {

// Token ids of each text as scored: [bos or eot] + its tokens, at most max_positions of them.
std::vector<std::vector<int32_t>> scored_text_ids(const Tokenizer& tok, const std::vector<std::string>& texts,
                                                  int64_t max_positions);

// log p(ids[t] | ids[0..t)) for t = 1.. of each sequence (size - 1 values), in batches of at most
// `batch` sequences of equal token length (no padding at all).
std::vector<std::vector<float>> sequence_token_logprobs(const Model& m, const std::vector<std::vector<int32_t>>& ids,
                                                        int64_t batch);

// Total log-probability of each text (an empty text scores 0).
std::vector<double> score_texts(const Model& m, const Tokenizer& tok, const std::vector<std::string>& texts,
                                int64_t batch);

}  // namespace jtok
