// Picks from a row's digest with sample_token's and token_logprob's arithmetic (infer/token_pick.h).
#include "infer/token_pick.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace jtok {

namespace {

// sample_token's sorted path (top_k and / or top_p) from the list: its keep, probabilities, cut and
// draw, bit for bit. -1 (the RNG untouched): the list does not hold what that path reads.
int32_t sorted_pick(const cuda::LogitDigest& d, int64_t V, const SamplingParams& p, std::mt19937_64& rng) {
  const int64_t n = d.n_top;
  int64_t keep = p.top_k > 0 && p.top_k < V ? p.top_k : V;  // sample_token's keep
  // Past the list, only the whole row's sum (sum_t) is known: enough for a top-p cut, not a top_k's sum.
  if (keep > n && (keep < V || p.top_p >= 1.0)) return -1;
  const int64_t m = std::min(keep, n);
  const double mx = d.top_logit[0];
  std::vector<double> prob(static_cast<size_t>(m));
  double sum = 0;
  for (int64_t i = 0; i < m; ++i) sum += (prob[static_cast<size_t>(i)] = std::exp((d.top_logit[i] - mx) / p.temperature));
  if (keep > n) sum = d.sum_t;
  if (p.top_p < 1.0) {  // smallest prefix with cumulative probability >= top_p
    double cum = 0;
    int64_t cut = keep;
    for (int64_t i = 0; i < m; ++i) {
      cum += prob[static_cast<size_t>(i)] / sum;
      if (cum >= p.top_p) {
        cut = i + 1;
        break;
      }
    }
    if (cut > m) return -1;  // the cut lies past the list (a flat row)
    keep = cut;
    sum = std::accumulate(prob.begin(), prob.begin() + keep, 0.0);
  }
  double r = std::uniform_real_distribution<double>(0.0, sum)(rng);
  for (int64_t i = 0; i < keep; ++i) {
    r -= prob[static_cast<size_t>(i)];
    if (r <= 0) return d.top_id[i];
  }
  return d.top_id[keep - 1];
}

// token_logprob's result from the digest: false when token's logit is not in it.
bool logprob_from_digest(const cuda::LogitDigest& d, int64_t V, int32_t token, int top_n, TokenLogprob& out) {
  if (token < 0 || token >= V) fail("token_logprob: token ", token, " outside [0, ", V, ")");
  if (top_n < 0 || top_n > kMaxTopLogprobs) fail("token_logprob: top_n ", top_n, " outside [0, ", kMaxTopLogprobs, "]");
  auto lp = [&](float x) { return static_cast<float>(static_cast<double>(x) - d.lse); };
  int i = 0;
  while (i < d.n_top && d.top_id[i] != token) ++i;
  if (i < d.n_top) out.logprob = lp(d.top_logit[i]);
  else if (token == d.drawn) out.logprob = lp(d.drawn_logit);
  else if (token == d.argmax) out.logprob = lp(d.max);
  else return false;
  out.token = token;
  out.top.clear();
  for (int j = 0; j < std::min(top_n, d.n_top); ++j) out.top.emplace_back(d.top_id[j], lp(d.top_logit[j]));
  return true;
}

}  // namespace

double top2_margin(const std::vector<float>& logits) {
  return top2_margin(logits.data(), static_cast<int64_t>(logits.size()));
}

double top2_margin(const float* logits, int64_t V) {
  float a = -std::numeric_limits<float>::infinity(), b = a;
  for (int64_t i = 0; i < V; ++i) {
    const float x = logits[i];
    if (x > a) {
      b = a;
      a = x;
    } else if (x > b) {
      b = x;
    }
  }
  return static_cast<double>(a) - b;
}

bool plain_temperature(const SamplingParams& p) { return p.temperature > 0 && p.top_k <= 0 && p.top_p >= 1.0; }

void digest_rows(const PickRequest* req, int64_t M, cuda::DigestRow* rows) {
  for (int64_t i = 0; i < M; ++i) {
    const SamplingParams& p = req[i].sampling;
    rows[i].temperature = p.temperature;
    rows[i].u = 0;
    if (!plain_temperature(p)) continue;
    if (!req[i].rng) fail("digest_rows: row ", i, " samples with a temperature but has no RNG");
    rows[i].u = std::generate_canonical<double, std::numeric_limits<double>::digits>(*req[i].rng);
  }
}

bool pick_from_digest(const cuda::LogitDigest& d, int64_t V, const PickRequest& req, TokenPick& out) {
  const SamplingParams& p = req.sampling;
  int32_t token = -1;
  if (p.temperature <= 0) {
    token = d.argmax;
  } else if (plain_temperature(p)) {
    token = d.drawn;  // its u already drawn (digest_rows)
  } else {
    if (!req.rng) fail("pick_from_digest: sampling with a temperature but no RNG");
    token = sorted_pick(d, V, p, *req.rng);
    if (token < 0) return false;
  }
  out.token = token;
  out.margin = 0;
  if (req.want_margin)
    out.margin = d.n_top > 1 ? static_cast<double>(d.top_logit[0]) - d.top_logit[1]
                             : std::numeric_limits<double>::infinity();
  out.logprob = TokenLogprob{};
  // Every token above is in the digest (the list, drawn or the argmax): the log-probs never need the
  // row once the RNG has moved.
  if (req.top_logprobs >= 0 && !logprob_from_digest(d, V, token, req.top_logprobs, out.logprob))
    fail("pick_from_digest: token ", token, " picked but not in the digest");
  return true;
}

TokenPick pick_from_row(const float* logits, int64_t V, const PickRequest& req) {
  std::mt19937_64 unused;  // greedy reads no RNG
  if (req.sampling.temperature > 0 && !req.rng) fail("pick_from_row: sampling with a temperature but no RNG");
  TokenPick out;
  out.token = sample_token(logits, V, req.sampling, req.rng ? *req.rng : unused);  // the row where it lies
  if (req.want_margin) out.margin = top2_margin(logits, V);
  if (req.top_logprobs >= 0) out.logprob = token_logprob(logits, V, out.token, req.top_logprobs);
  return out;
}

int64_t pick_rows(const cuda::LogitDigest* d, int64_t M, int64_t V, const PickRequest* req, TokenPick* out,
                  const RowSource& row) {
  int64_t full = 0;
  std::vector<float> buf;
  for (int64_t i = 0; i < M; ++i) {
    if (pick_from_digest(d[i], V, req[i], out[i])) continue;
    buf.resize(static_cast<size_t>(V));
    row(i, buf.data());
    out[i] = pick_from_row(buf.data(), V, req[i]);
    ++full;
  }
  return full;
}

}  // namespace jtok
