// Picking a decode step's token from its row's digest (infer/token_pick.h, the reference digest
// cuda/logit_digest_ref.cpp) gives sample_token's token, leaves the RNG where sample_token leaves it,
// and token_logprob's log-probs, bit for bit; where the digest does not suffice it says so with the
// RNG untouched, and pick_rows then picks from the full row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cuda/logit_digest.h"
#include "infer/token_pick.h"

using namespace jtok;

namespace {

// A peaked row (V): normal logits with planted ties: three copies of the maximum, a run of equal
// values across the 64th rank (so the list's cut splits ties by id) and a few equal pairs.
std::vector<float> peaked_row(int64_t V, uint64_t seed, float scale) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0.f, scale);
  std::vector<float> l(static_cast<size_t>(V));
  for (float& x : l) x = n(g);
  std::vector<float> s = l;
  std::sort(s.begin(), s.end(), std::greater<float>());
  const float top = s[0] + 1.0f, at64 = s[std::min<int64_t>(V - 1, 62)];
  std::uniform_int_distribution<int64_t> id(0, V - 1);
  for (int k = 0; k < 3; ++k) l[static_cast<size_t>(id(g))] = top;
  for (int k = 0; k < 8; ++k) l[static_cast<size_t>(id(g))] = at64;
  for (int k = 0; k < 6; ++k) l[static_cast<size_t>(id(g))] = l[static_cast<size_t>(id(g))];
  return l;
}

// A flat row: every logit within 0.01 of the others (a top-p cut far past 64 ids).
std::vector<float> flat_row(int64_t V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(0.f, 0.01f);
  std::vector<float> l(static_cast<size_t>(V));
  for (float& x : l) x = u(g);
  l[static_cast<size_t>(V / 3)] = l[static_cast<size_t>(V / 2)];
  return l;
}

void expect_same_logprob(const TokenLogprob& a, const TokenLogprob& b) {
  EXPECT_EQ(a.token, b.token);
  EXPECT_EQ(a.logprob, b.logprob);
  ASSERT_EQ(a.top.size(), b.top.size());
  for (size_t i = 0; i < a.top.size(); ++i) {
    EXPECT_EQ(a.top[i].first, b.top[i].first) << i;
    EXPECT_EQ(a.top[i].second, b.top[i].second) << i;
  }
}

// `steps` picks in a row of one sequence from row l: from its digest, each one against sample_token
// + token_logprob on the row with a twin RNG. Returns the picks the digest settled (on a miss: the
// RNG untouched, then the full row's pick, so the twins go on in step).
int picks_match(const std::vector<float>& l, const SamplingParams& p, int top_logprobs, int steps, uint64_t seed) {
  const int64_t V = static_cast<int64_t>(l.size());
  std::mt19937_64 want_rng(seed), got_rng(seed);
  int settled = 0;
  for (int s = 0; s < steps; ++s) {
    const PickRequest want_req{p, &want_rng, top_logprobs, true}, got_req{p, &got_rng, top_logprobs, true};
    const TokenPick want = pick_from_row(l.data(), V, want_req);
    EXPECT_EQ(want.margin, top2_margin(l)) << "step " << s;
    cuda::DigestRow row;
    digest_rows(&got_req, 1, &row);
    const cuda::LogitDigest d = cuda::logit_digest_ref(l.data(), V, row);
    const std::mt19937_64 before = got_rng;
    TokenPick got;
    if (pick_from_digest(d, V, got_req, got)) {
      ++settled;
      EXPECT_EQ(got.token, want.token) << "step " << s;
      EXPECT_EQ(got.margin, want.margin) << "step " << s;
      if (top_logprobs >= 0) expect_same_logprob(got.logprob, want.logprob);
    } else {
      EXPECT_TRUE(got_rng == before) << "a miss moved the RNG";
      EXPECT_FALSE(plain_temperature(p)) << "plain temperature always settles";
      got = pick_from_row(l.data(), V, got_req);
      EXPECT_EQ(got.token, want.token);
    }
    EXPECT_TRUE(got_rng == want_rng) << "step " << s;
  }
  return settled;
}

constexpr int64_t kV = 3001;

}  // namespace

TEST(TokenPick, ReferenceDigestOrdersAsTheComparator) {
  const std::vector<float> l = peaked_row(kV, 1, 2.f);
  const cuda::LogitDigest d = cuda::logit_digest_ref(l.data(), kV, {1.0, 0.5});
  EXPECT_EQ(d.argmax, std::max_element(l.begin(), l.end()) - l.begin());
  ASSERT_EQ(d.n_top, cuda::kDigestTop);
  for (int i = 1; i < d.n_top; ++i) {
    const bool ordered = d.top_logit[i - 1] > d.top_logit[i] ||
                         (d.top_logit[i - 1] == d.top_logit[i] && d.top_id[i - 1] < d.top_id[i]);
    EXPECT_TRUE(ordered) << i;
    EXPECT_EQ(l[static_cast<size_t>(d.top_id[i])], d.top_logit[i]);
  }
  EXPECT_EQ(d.top_id[0], d.argmax);
  EXPECT_EQ(d.top_logit[1], d.top_logit[0]);  // the planted maxima, lower id first
  const float last = d.top_logit[d.n_top - 1];  // nothing outside the list beats its last entry
  for (int64_t j = 0; j < kV; ++j) {
    const bool listed = std::find(d.top_id, d.top_id + d.n_top, j) != d.top_id + d.n_top;
    if (!listed) {
      EXPECT_TRUE(l[j] < last || (l[j] == last && j > d.top_id[d.n_top - 1])) << j;
    }
  }
  EXPECT_EQ(d.drawn_logit, l[static_cast<size_t>(d.drawn)]);
}

TEST(TokenPick, GreedyIsTheArgmax) {
  for (uint64_t seed = 0; seed < 4; ++seed) {
    EXPECT_EQ(picks_match(peaked_row(kV, seed, 2.f), {0.0, 0, 1.0}, 5, 3, seed), 3);
    EXPECT_EQ(picks_match(flat_row(kV, seed), {0.0, 0, 1.0}, 20, 3, seed), 3);
  }
}

TEST(TokenPick, TopKFromTheList) {
  for (int64_t k : {1, 5, 64})
    for (uint64_t seed = 0; seed < 3; ++seed) {
      EXPECT_EQ(picks_match(peaked_row(kV, seed, 1.f), {0.8, k, 1.0}, 3, 30, seed), 30) << k;
      EXPECT_EQ(picks_match(flat_row(kV, seed), {1.0, k, 1.0}, 20, 30, seed), 30) << k;  // ties across rank 64
    }
  EXPECT_EQ(picks_match(peaked_row(kV, 7, 1.f), {0.9, 5, 0.9}, 2, 40, 7), 40);
  EXPECT_EQ(picks_match(flat_row(kV, 7), {0.9, 5, 0.9}, 2, 40, 7), 40);
}

TEST(TokenPick, TopPWithinTheListElseTheFullRow) {
  for (double top_p : {0.5, 0.9})
    for (uint64_t seed = 0; seed < 3; ++seed) {
      EXPECT_EQ(picks_match(peaked_row(kV, seed, 4.f), {0.7, 0, top_p}, 4, 30, seed), 30) << top_p;
      EXPECT_EQ(picks_match(flat_row(kV, seed), {1.0, 0, top_p}, 4, 10, seed), 0) << top_p;
    }
  // top_k past the list with top_p: only a cut over the whole row's sum is known: the full row.
  EXPECT_EQ(picks_match(peaked_row(kV, 3, 4.f), {1.0, 100, 0.9}, -1, 5, 3), 0);
  // top_k >= V: sample_token's full sort, as top_k 0; without top_p its draw spans the whole row.
  EXPECT_EQ(picks_match(peaked_row(kV, 3, 4.f), {1.0, kV, 0.9}, -1, 5, 3), 5);
  EXPECT_EQ(picks_match(peaked_row(kV, 3, 4.f), {1.0, kV, 1.0}, -1, 5, 3), 0);
}

TEST(TokenPick, PlainTemperatureDrawsBeforeTheStep) {
  for (double t : {0.7, 1.0, 1.5})
    for (uint64_t seed = 0; seed < 3; ++seed) {
      EXPECT_EQ(picks_match(peaked_row(kV, seed, 1.f), {t, 0, 1.0}, 20, 30, seed), 30) << t;
      EXPECT_EQ(picks_match(flat_row(kV, seed), {t, 0, 1.0}, 0, 30, seed), 30) << t;
    }
}

TEST(TokenPick, SmallVocabularyListsEveryId) {
  const int64_t V = 40;
  const std::vector<float> l = peaked_row(V, 5, 1.f);
  EXPECT_EQ(picks_match(l, {1.0, 0, 0.9}, 20, 20, 5), 20);
  EXPECT_EQ(picks_match(l, {1.0, V, 1.0}, 20, 20, 5), 20);  // full sort, no cut: the list is the row
  EXPECT_EQ(picks_match(l, {1.3, 0, 1.0}, 20, 20, 5), 20);
}

// The top-2 margin only when asked (generate's record; the serving engine does not ask): from the
// row and from its digest, top2_margin of the row when want_margin, else 0.
TEST(TokenPick, MarginOnlyWhenAsked) {
  std::vector<float> l = peaked_row(kV, 9, 2.f);
  l[7] = *std::max_element(l.begin(), l.end()) + 0.75f;  // one maximum (peaked_row plants a tie)
  const double margin = top2_margin(l);
  ASSERT_GT(margin, 0.5);
  const std::vector<SamplingParams> params = {{0.0, 0, 1.0}, {1.0, 0, 1.0}, {0.8, 5, 1.0}};  // digest-settled
  for (const SamplingParams& p : params)
    for (bool want_margin : {false, true}) {
      std::mt19937_64 row_rng(3), digest_rng(3);
      const PickRequest row_req{p, &row_rng, -1, want_margin}, digest_req{p, &digest_rng, -1, want_margin};
      EXPECT_EQ(pick_from_row(l.data(), kV, row_req).margin, want_margin ? margin : 0.0) << p.temperature;
      cuda::DigestRow row;
      digest_rows(&digest_req, 1, &row);
      TokenPick got;
      got.margin = -1;  // overwritten either way
      ASSERT_TRUE(pick_from_digest(cuda::logit_digest_ref(l.data(), kV, row), kV, digest_req, got));
      EXPECT_EQ(got.margin, want_margin ? margin : 0.0) << p.temperature;
    }
}

// pick_rows over a fake digest source (the reference's digests, the host's rows): the rows the
// digests do not settle come from the source, and every pick equals the row-by-row one.
TEST(TokenPick, PickRowsFallsBackToTheRow) {
  const std::vector<SamplingParams> params = {{0.0, 0, 1.0}, {1.0, 0, 0.5}, {0.7, 5, 1.0}, {1.0, 0, 1.0},
                                              {1.0, 0, 0.9}, {0.9, 0, 0.9}};
  const int64_t M = static_cast<int64_t>(params.size());
  std::vector<std::vector<float>> rows;
  for (int64_t i = 0; i < M; ++i) rows.push_back(i % 2 ? flat_row(kV, 10 + i) : peaked_row(kV, 10 + i, 4.f));
  std::vector<std::mt19937_64> want_rng, got_rng;
  for (int64_t i = 0; i < M; ++i) want_rng.emplace_back(100 + i), got_rng.emplace_back(100 + i);
  std::vector<PickRequest> want_req, got_req;
  for (int64_t i = 0; i < M; ++i) {
    want_req.push_back({params[i], &want_rng[i], 3});
    got_req.push_back({params[i], &got_rng[i], 3});
  }
  std::vector<cuda::DigestRow> in(static_cast<size_t>(M));
  digest_rows(got_req.data(), M, in.data());
  std::vector<cuda::LogitDigest> d;
  for (int64_t i = 0; i < M; ++i) d.push_back(cuda::logit_digest_ref(rows[i].data(), kV, in[i]));
  std::vector<int64_t> asked;
  std::vector<TokenPick> got(static_cast<size_t>(M));
  const int64_t full = pick_rows(d.data(), M, kV, got_req.data(), got.data(), [&](int64_t i, float* out) {
    asked.push_back(i);
    std::copy(rows[i].begin(), rows[i].end(), out);
  });
  EXPECT_EQ(full, 2);  // the flat rows with top_p 0.5 and 0.9 (row 3 is flat but plain temperature)
  EXPECT_EQ(asked, (std::vector<int64_t>{1, 5}));
  for (int64_t i = 0; i < M; ++i) {
    const TokenPick want = pick_from_row(rows[i].data(), kV, want_req[i]);
    EXPECT_EQ(got[i].token, want.token) << i;
    expect_same_logprob(got[i].logprob, want.logprob);
    EXPECT_TRUE(got_rng[i] == want_rng[i]) << i;
  }
}
