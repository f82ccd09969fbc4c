// Log-probabilities and several choices in the serving engine: token_logprob is the log-softmax
// with its top N; n choices of one request are each what a single request with its derived seed
// gives (tokens and log-probs, bit for bit); the echoed prompt's log-probs (whole and chunked
// prefill) equal the training forward's within 1e-5; the request fields are checked (4xx).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "core/error.h"
#include "infer/logprobs.h"
#include "serve/completion_request.h"
#include "serve/engine.h"
#include "serve_test_util.h"

using namespace jtok;
using namespace jtok::testing;

TEST(Logprobs, TokenLogprobIsTheLogSoftmaxWithItsTopN) {
  const int64_t V = 1000;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  std::vector<float> x(V);
  for (auto& v : x) v = nd(rng);
  x[10] = x[20] = x[30] = 30.0f;  // a three-way tie at the top: lower ids first
  long double sum = 0;
  const float mx = *std::max_element(x.begin(), x.end());
  for (float v : x) sum += std::exp(static_cast<long double>(v) - mx);
  auto ref = [&](int64_t j) { return static_cast<double>(static_cast<long double>(x[j]) - mx - std::log(sum)); };
  for (int32_t tok : {0, 10, 500, 999}) {
    const TokenLogprob lp = token_logprob(x.data(), V, tok, 5);
    EXPECT_EQ(lp.token, tok);
    EXPECT_NEAR(lp.logprob, ref(tok), 1e-6 * std::max(1.0, std::fabs(ref(tok))));
    ASSERT_EQ(lp.top.size(), 5u);
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
    for (int k = 0; k < 5; ++k) {
      EXPECT_EQ(lp.top[k].first, order[k]) << k;
      EXPECT_NEAR(lp.top[k].second, ref(order[k]), 1e-6 * std::max(1.0, std::fabs(ref(order[k]))));
    }
    EXPECT_EQ(lp.top[0].first, 10);
    EXPECT_EQ(lp.top[1].first, 20);
  }
  EXPECT_TRUE(token_logprob(x.data(), V, 3, 0).top.empty());
  double total = 0;  // the distribution sums to 1
  for (int64_t j = 0; j < V; ++j) total += std::exp(static_cast<double>(token_logprob(x.data(), V, static_cast<int32_t>(j), 0).logprob));
  EXPECT_NEAR(total, 1.0, 1e-5);
  EXPECT_THROW(token_logprob(x.data(), V, static_cast<int32_t>(V), 0), Error);
  EXPECT_THROW(token_logprob(x.data(), V, 0, kMaxTopLogprobs + 1), Error);
}

// n = 4: the prompt is prefilled once, and choice i is, token for token and log-prob for log-prob,
// what a single request with seed + i gives (alone, and through the engine), beside other traffic.
TEST(ServeEngine, NChoicesEachEqualASingleRequestWithItsSeed) {
  Model m = make_model(tiny_serve_config(), 4);
  EngineOptions o;
  o.max_batch = 8;
  Engine e(m, o);
  GenerationRequest r;
  r.prompt = {5, 17, 33, 2, 41};
  r.max_tokens = 9;
  r.sampling = {0.9, 0, 1.0};
  r.seed = 40;
  r.top_logprobs = 3;
  r.n = 4;
  GenerationRequest other = r;  // a single request decoding in the same steps
  other.n = 1;
  other.prompt = {9, 9};
  other.seed = 7;
  auto seqs = e.submit_choices(r);
  auto other_seq = e.submit(other);
  ASSERT_EQ(seqs.size(), 4u);
  std::vector<std::shared_ptr<Sequence>> singles;
  for (uint64_t i = 0; i < 4; ++i) {
    GenerationRequest s = r;
    s.n = 1;
    s.seed = r.seed + i;
    singles.push_back(e.submit(s));
  }
  std::set<std::vector<int32_t>> distinct;
  for (size_t i = 0; i < 4; ++i) {
    wait_done(*seqs[i]);
    wait_done(*singles[i]);
    GenerationRequest s = r;
    s.seed = r.seed + i;
    const Alone a = alone(m, s);
    EXPECT_EQ(seqs[i]->seed, r.seed + i);
    EXPECT_EQ(seqs[i]->tokens, a.tokens) << "choice " << i;
    EXPECT_EQ(singles[i]->tokens, a.tokens) << "single " << i;
    ASSERT_EQ(seqs[i]->logprobs.size(), a.tokens.size());
    for (size_t t = 0; t < a.tokens.size(); ++t) {
      expect_same(seqs[i]->logprobs[t], a.lps[t], "choice " + std::to_string(i) + " token " + std::to_string(t));
      expect_same(singles[i]->logprobs[t], a.lps[t], "single " + std::to_string(i));
      EXPECT_EQ(seqs[i]->logprobs[t].top.size(), 3u);
    }
    distinct.insert(a.tokens);
  }
  EXPECT_GT(distinct.size(), 1u);  // the seeds differ, so (at temperature 0.9) do the choices
  wait_done(*other_seq);
  EXPECT_EQ(other_seq->tokens, alone(m, other).tokens);
  const EngineStats st = settled(e, 9);
  EXPECT_EQ(st.requests_admitted, 9);
  EXPECT_EQ(st.requests_finished, 9);
  EXPECT_EQ(st.choices_forked, 3);
  EXPECT_EQ(st.prefills, 6);  // the four choices' prompt once
  EXPECT_EQ(st.kv_tokens_used, 0);
  // n beyond the batch, or beyond the KV budget, is refused.
  r.n = 9;
  EXPECT_THROW(e.submit_choices(r), Error);
  EngineOptions small = o;
  small.kv_budget_tokens = 48;
  Engine e2(m, small);
  r.n = 4;
  r.max_tokens = 9;  // 4 x 14 > 48
  EXPECT_THROW(e2.submit_choices(r), Error);
  r.top_logprobs = kMaxTopLogprobs + 1;
  r.n = 1;
  EXPECT_THROW(e2.submit_choices(r), Error);
}

// echo: the prompt's own tokens' log-probs from the prefill, whole or in chunks of 4, equal the
// training forward's (token_logprobs, what jtok eval sums for BLiMP) within 1e-5; max_tokens 0
// generates nothing.
TEST(ServeEngine, EchoLogprobsEqualTheFullForward) {
  Model m = make_model(tiny_serve_config(), 4);
  std::vector<int32_t> prompt;
  for (int j = 0; j < 11; ++j) prompt.push_back(static_cast<int32_t>((j * 31 + 3) % 97));
  const int64_t T = static_cast<int64_t>(prompt.size()) - 1;
  Activations acts;
  forward(m, acts, prompt.data(), 1, T);
  std::vector<float> want(static_cast<size_t>(T));
  token_logprobs(m, acts, prompt.data() + 1, want.data());
  for (int64_t chunk : {512, 4}) {
    EngineOptions o;
    o.prefill_chunk = chunk;
    Engine e(m, o);
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = 0;
    r.top_logprobs = 2;
    r.prompt_logprobs = true;
    r.n = 2;
    auto seqs = e.submit_choices(r);
    ASSERT_EQ(seqs.size(), 2u);
    for (auto& s : seqs) {
      wait_done(*s);
      EXPECT_EQ(s->finish_reason, "length");
      EXPECT_TRUE(s->tokens.empty());
      ASSERT_EQ(static_cast<int64_t>(s->prompt_logprobs.size()), T) << "chunk " << chunk;
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(s->prompt_logprobs[t].token, prompt[t + 1]);
        EXPECT_NEAR(s->prompt_logprobs[t].logprob, want[t], 1e-5) << "chunk " << chunk << " position " << t + 1;
        ASSERT_EQ(s->prompt_logprobs[t].top.size(), 2u);
        EXPECT_GE(s->prompt_logprobs[t].top[0].second, s->prompt_logprobs[t].logprob - 1e-6f);
      }
    }
    const EngineStats st = settled(e, 2);
    EXPECT_EQ(st.prompt_logprob_tokens, T);
    EXPECT_EQ(st.prefill_chunks, chunk == 4 ? 3 : 1);
    EXPECT_EQ(st.kv_tokens_used, 0);
  }
}

TEST(CompletionRequest, LogprobsEchoAndChoicesAreChecked) {
  const CompletionLimits lim{"jtok", 100, 0, 8};
  auto encode = [](const std::string& t) {
    std::vector<int32_t> ids;
    for (unsigned char c : t) ids.push_back(c % 100);
    return ids;
  };
  auto error_of = [&](const std::string& body) {
    auto r = parse_completion_request(body, lim, encode);
    const ApiError* e = std::get_if<ApiError>(&r);
    return e ? std::to_string(e->status) + " " + e->param : std::string("ok");
  };
  auto r = parse_completion_request(R"({"prompt": "ab", "max_tokens": 0, "echo": true, "logprobs": 5.0, "n": 3, "best_of": 4})",
                                    lim, encode);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r));
  const auto& q = std::get<CompletionRequest>(r);
  EXPECT_EQ(q.max_tokens, 0);
  EXPECT_TRUE(q.echo);
  EXPECT_EQ(q.logprobs, 5);
  EXPECT_EQ(q.n, 3);
  EXPECT_EQ(q.best_of, 4);
  EXPECT_EQ(std::get<CompletionRequest>(parse_completion_request(R"({"prompt": "a", "n": 2})", lim, encode)).best_of, 2);
  EXPECT_EQ(std::get<CompletionRequest>(parse_completion_request(R"({"prompt": "a"})", lim, encode)).logprobs, -1);
  EXPECT_EQ(error_of(R"({"prompt": "a", "logprobs": 20})"), "ok");
  EXPECT_EQ(error_of(R"({"prompt": "a", "logprobs": 21})"), "400 logprobs");
  EXPECT_EQ(error_of(R"({"prompt": "a", "logprobs": -1})"), "400 logprobs");
  EXPECT_EQ(error_of(R"({"prompt": "a", "logprobs": 2.5})"), "400 logprobs");
  EXPECT_EQ(error_of(R"({"prompt": "a", "logprobs": true})"), "400 logprobs");
  EXPECT_EQ(error_of(R"({"prompt": "a", "echo": 1})"), "400 echo");
  EXPECT_EQ(error_of(R"({"prompt": "a", "max_tokens": 0})"), "400 max_tokens");
  EXPECT_EQ(error_of(R"({"prompt": "a", "max_tokens": 0, "echo": false})"), "400 max_tokens");
  EXPECT_EQ(error_of(R"({"prompt": "a", "max_tokens": -1, "echo": true})"), "400 max_tokens");
  EXPECT_EQ(error_of(R"({"prompt": "a", "n": 8})"), "ok");
  EXPECT_EQ(error_of(R"({"prompt": "a", "n": 9})"), "400 n");
  EXPECT_EQ(error_of(R"({"prompt": "a", "n": 0})"), "400 n");
  EXPECT_EQ(error_of(R"({"prompt": "a", "n": 3, "best_of": 2})"), "400 best_of");
  EXPECT_EQ(error_of(R"({"prompt": "a", "best_of": 9})"), "400 best_of");
  EXPECT_EQ(error_of(R"({"prompt": "a", "n": 2, "best_of": 3, "stream": true})"), "400 best_of");
  EXPECT_EQ(error_of(R"({"prompt": "a", "n": 2, "stream": true})"), "ok");
}

// The per-position logits hook of prefill / prefill_chunk: every prompt position once, in order,
// each row equal to the training forward's logits within 1e-5 of their largest, and the prefill's
// own result (returned logits, cache) bit for bit what it is without the hook.
TEST(Generate, PositionLogitsCoverThePromptAndLeaveThePrefillAlone) {
  Model m = make_model(tiny_serve_config(), 4);
  const int64_t V = m.cfg.vocab_size, Vp = m.cfg.padded_vocab();
  std::vector<int32_t> prompt;
  for (int j = 0; j < 37; ++j) prompt.push_back(static_cast<int32_t>((j * 13 + 1) % 97));  // > one 32-row block
  const int64_t P = static_cast<int64_t>(prompt.size());
  Activations acts;
  forward(m, acts, prompt.data(), 1, P);
  float scale = 0;
  for (int64_t i = 0; i < P * Vp; ++i) scale = std::max(scale, std::fabs(acts.logits[i]));
  for (int64_t first : {P, int64_t{10}}) {  // whole, then 10 + chunks of 9
    std::vector<int64_t> seen;
    float worst = 0;
    PositionLogits each = [&](int64_t pos, int64_t n, const float* l) {
      for (int64_t r = 0; r < n; ++r) {
        seen.push_back(pos + r);
        for (int64_t v = 0; v < V; ++v)
          worst = std::max(worst, std::fabs(l[r * V + v] - acts.logits[(pos + r) * Vp + v]));
      }
    };
    KVCache with, without;
    std::vector<float> lw = prefill(m, with, {prompt.begin(), prompt.begin() + first}, P, each);
    std::vector<float> lo = prefill(m, without, {prompt.begin(), prompt.begin() + first}, P);
    for (int64_t at = first; at < P; at += 9) {
      const int64_t n = std::min<int64_t>(9, P - at);
      lw = prefill_chunk(m, with, prompt.data() + at, n, nullptr, each);
      lo = prefill_chunk(m, without, prompt.data() + at, n);
    }
    EXPECT_EQ(lw, lo) << "first " << first;
    EXPECT_EQ(with.k, without.k);
    EXPECT_EQ(with.v, without.v);
    std::vector<int64_t> all(static_cast<size_t>(P));
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all) << "first " << first;
    EXPECT_LE(worst, 1e-5f * scale) << "first " << first;
  }
}
