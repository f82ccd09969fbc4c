// The CPU twin of the GPU's logit digest (src/cuda/logit_digest.h): every quantity with the
// arithmetic of the host code it stands in for, so a pick from it has sample_token's and
// token_logprob's bits (tests/test_token_pick.cpp).
//   max, argmax: std::max_element's. lse: token_logprob's (exp of the f32 difference l - max, summed
//   in double in index order). top list: the comparator's order (a full sort when sum_t needs it).
//   sum_t: sample_token's top-p sum, over the sorted ids. drawn: sample_token's plain temperature
//   path (its index-order sum, r = u * sum, r -= w_i until r <= 0, else the last id).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "cuda/logit_digest.h"

namespace jtok::cuda {

namespace {

// max, argmax and lse as std::max_element and token_logprob compute them.
void digest_max_lse(LogitDigest& d, const float* l, int64_t V) {
  d.argmax = static_cast<int32_t>(std::max_element(l, l + V) - l);
  d.max = l[d.argmax];
  double sum = 0;
  for (int64_t j = 0; j < V; ++j) sum += std::exp(static_cast<double>(l[j] - d.max));
  d.lse = static_cast<double>(d.max) + std::log(sum);
}

// The top list and, with a temperature, sum_t over the whole sorted row (sample_token's top-p sum).
void digest_sorted(LogitDigest& d, const float* l, int64_t V, double T) {
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  d.n_top = static_cast<int32_t>(std::min<int64_t>(V, kDigestTop));
  if (T > 0) std::sort(idx.begin(), idx.end(), better);
  else std::partial_sort(idx.begin(), idx.begin() + d.n_top, idx.end(), better);
  for (int32_t i = 0; i < d.n_top; ++i) {
    d.top_id[i] = idx[static_cast<size_t>(i)];
    d.top_logit[i] = l[idx[static_cast<size_t>(i)]];
  }
  if (T <= 0) return;
  const double mx = l[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp((l[idx[static_cast<size_t>(i)]] - mx) / T);
  d.sum_t = sum;
}

// Plain temperature sampling's pick for the draw u: sample_token's own loop.
void digest_drawn(LogitDigest& d, const float* l, int64_t V, double T, double u) {
  const double mx = d.max;
  std::vector<double> w(static_cast<size_t>(V));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += (w[static_cast<size_t>(i)] = std::exp((l[i] - mx) / T));
  double r = u * (sum - 0.0) + 0.0;  // uniform_real_distribution<double>(0, sum) given its canonical u
  d.drawn = static_cast<int32_t>(V - 1);
  for (int64_t i = 0; i < V; ++i) {
    r -= w[static_cast<size_t>(i)];
    if (r <= 0) {
      d.drawn = static_cast<int32_t>(i);
      break;
    }
  }
  d.drawn_logit = l[d.drawn];
}

}  // namespace

LogitDigest logit_digest_ref(const float* logits, int64_t V, const DigestRow& row) {
  if (V <= 0) fail("logit_digest_ref: a row of ", V, " logits");
  if (!(row.u >= 0 && row.u < 1)) fail("logit_digest_ref: u ", row.u, " outside [0, 1)");
  LogitDigest d;
  digest_max_lse(d, logits, V);
  digest_sorted(d, logits, V, row.temperature);
  if (row.temperature > 0) digest_drawn(d, logits, V, row.temperature, row.u);
  return d;
}

}  // namespace jtok::cuda
