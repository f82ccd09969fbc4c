#include "infer/logprobs.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace jtok {

TokenLogprob token_logprob(const float* logits, int64_t V, int32_t token, int top_n) {
  if (V <= 0 || token < 0 || token >= V) fail("token_logprob: token ", token, " outside [0, ", V, ")");
  if (top_n < 0 || top_n > kMaxTopLogprobs) fail("token_logprob: top_n ", top_n, " outside [0, ", kMaxTopLogprobs, "]");
  float mx = logits[0];
  for (int64_t j = 1; j < V; ++j) mx = std::max(mx, logits[j]);
  double sum = 0;
  for (int64_t j = 0; j < V; ++j) sum += std::exp(static_cast<double>(logits[j] - mx));
  const double lse = static_cast<double>(mx) + std::log(sum);
  auto lp = [&](int64_t j) { return static_cast<float>(static_cast<double>(logits[j]) - lse); };
  TokenLogprob out;
  out.token = token;
  out.logprob = lp(token);
  // The top_n ids: a small sorted list, most likely first, ties to the lower id (ids come in order,
  // so an equal logit later never displaces an earlier one).
  auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::vector<int32_t> best;
  best.reserve(static_cast<size_t>(top_n) + 1);
  for (int32_t j = 0; j < V && top_n > 0; ++j) {
    if (static_cast<int>(best.size()) == top_n && !better(j, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), j, better), j);
    if (static_cast<int>(best.size()) > top_n) best.pop_back();
  }
  for (int32_t j : best) out.top.emplace_back(j, lp(j));
  return out;
}

}  // namespace jtok
