// Log-probabilities of tokens under a next-token distribution: what /v1/completions returns with
// `logprobs` (each sampled or echoed token's log-prob and the most likely alternatives).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace jtok {

constexpr int kMaxTopLogprobs = 20;

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;                            // log p(token | prefix)
  std::vector<std::pair<int32_t, float>> top;   // the most likely ids and their log-probs, most likely first
};

// logits (V) over the real vocabulary: log-softmax of `token` and of the top_n most likely ids
// (0 <= top_n <= kMaxTopLogprobs; ties go to the lower id). The maximum and the logits are f32 as
// given, the sum of exp(x - max) is taken in double, each log-prob is x - max - log(sum) rounded
// to f32 once.
TokenLogprob token_logprob(const float* logits, int64_t V, int32_t token, int top_n);

}  // namespace jtok
