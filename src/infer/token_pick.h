// A decode step's token picked on the host from its row's digest (cuda/logit_digest.h: argmax, lse,
// the 64 most likely ids, the plain-temperature draw) instead of the whole row (issue 40: sampling on
// the GPU), with exactly sample_token's token, RNG use and token_logprob's log-probs wherever the
// digest holds what they read; where it does not, the caller copies that row back and picks from it
// (pick_from_row), the RNG untouched until then.
//   greedy (temperature <= 0): the argmax.
//   plain temperature (top_k <= 0, top_p >= 1): the digest's `drawn`, for the u that digest_rows
//     drew from the sequence's RNG before the step (one canonical draw: what sample_token's
//     uniform_real_distribution consumes). Never the full row.
//   top_k in (0, n_top]: sample_token's partial sort gives the list's first top_k: its
//     probabilities, top-p cut and draw from the list.
//   top_k <= 0 or >= V, top_p < 1: the cumulative cut over sum_t (the whole row's sum); the list
//     suffices when the cut falls within it (peaked rows), else the full row (flat rows).
//   anything else (top_k in (n_top, V); top_k >= V with top_p >= 1): the full row.
// Log-probs: token_logprob's, from lse and the list (top_logprobs <= kMaxTopLogprobs <= kDigestTop);
// the token's logit from the list, `drawn` or the argmax, else the full row.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "cuda/logit_digest.h"
#include "infer/generate.h"
#include "infer/logprobs.h"

namespace jtok {

static_assert(kMaxTopLogprobs <= cuda::kDigestTop, "a digest lists every top log-prob a request may ask");

// What a decode step's row asks of its pick: the sampling, the sequence's RNG, top_logprobs
// (-1: no log-probs; 0..kMaxTopLogprobs: the token's and that many of the most likely) and whether
// it wants the row's top-2 margin (generate records it; from the full row it costs one more pass).
struct PickRequest {
  SamplingParams sampling;
  std::mt19937_64* rng = nullptr;
  int top_logprobs = -1;
  bool want_margin = false;
};

struct TokenPick {
  int32_t token = -1;
  TokenLogprob logprob;  // when top_logprobs >= 0
  double margin = 0;     // when want_margin: top2_margin of the row (the digest's first two logits); else 0
};

// Logit of the best token minus that of the second best: how close greedy decoding was to a tie
// (+inf for a single logit).
double top2_margin(const std::vector<float>& logits);
double top2_margin(const float* logits, int64_t V);

// Plain temperature sampling: the one path whose draw is made before the step (on the device).
bool plain_temperature(const SamplingParams& p);
// rows (M) = the digest inputs of req's M rows: the temperature, and for plain temperature sampling
// u = one canonical draw of the row's RNG (consumed now, as sample_token would consume it).
void digest_rows(const PickRequest* req, int64_t M, cuda::DigestRow* rows);
// The pick from a digest made with digest_rows' inputs: true and out set, or false (the full row is
// needed) with req's RNG untouched.
bool pick_from_digest(const cuda::LogitDigest& d, int64_t V, const PickRequest& req, TokenPick& out);
// The pick from the full row (V): sample_token, then token_logprob.
TokenPick pick_from_row(const float* logits, int64_t V, const PickRequest& req);
// The full row i's logits (V) into out: a decoder's copy back of a row the digest did not settle.
using RowSource = std::function<void(int64_t i, float* out)>;
// out (M) = each row's pick from its digest d[i], or from row(i) where the digest does not suffice.
// Returns the rows that needed the full row.
int64_t pick_rows(const cuda::LogitDigest* d, int64_t M, int64_t V, const PickRequest* req, TokenPick* out,
                  const RowSource& row);

}  // namespace jtok
