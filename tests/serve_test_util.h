// Helpers of the serving engine's tests (test_serve_engine, test_serve_logprobs, test_serve_prefix):
// a tiny JTok + JTok-M model, what `jtok generate` gives for one request alone, log-probs compared
// bit for bit, and waiting for a sequence or for the engine's statistics to settle.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "infer/generate.h"
#include "infer/logprobs.h"
#include "serve/engine.h"
#include "model_test_util.h"

namespace jtok::testing {

inline ModelConfig tiny_serve_config() {
  ModelConfig c = tiny_jtok_config({});
  c.initializer_range = 0.2;
  c.jtokm_scale_init = 2.0;
  return c;
}

struct Alone {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> lps;
};

// What `jtok generate` does for one request (prefill, then sample / decode_step), with the
// log-prob of each sampled token from the logits it was sampled from. chunk > 0: the prompt
// prefilled in pieces of chunk tokens (prefill_chunked), as the engine does with prefix reuse.
inline Alone alone(const Model& m, const GenerationRequest& r, bool kv_bf16 = false, int64_t chunk = 0) {
  KVCache cache;
  cache.bf16 = kv_bf16;
  std::mt19937_64 rng(r.seed);
  const int64_t cap = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  std::vector<float> l = chunk > 0 ? prefill_chunked(m, cache, r.prompt, cap, chunk) : prefill(m, cache, r.prompt, cap);
  Alone out;
  for (int64_t i = 0; i < r.max_tokens; ++i) {
    const int32_t t = sample_token(l, r.sampling, rng);
    if (std::find(r.stop_tokens.begin(), r.stop_tokens.end(), t) != r.stop_tokens.end()) break;
    out.tokens.push_back(t);
    out.lps.push_back(token_logprob(l.data(), m.cfg.vocab_size, t, std::max(r.top_logprobs, 0)));
    if (i + 1 < r.max_tokens) l = decode_step(m, cache, t);
  }
  return out;
}

inline void wait_done(Sequence& s) {
  std::unique_lock<std::mutex> lk(s.mu);
  s.cv.wait(lk, [&] { return s.done; });
}

inline void expect_same(const TokenLogprob& a, const TokenLogprob& b, const std::string& where) {
  EXPECT_EQ(a.token, b.token) << where;
  EXPECT_EQ(a.logprob, b.logprob) << where;  // the same bits: same logits, same arithmetic
  EXPECT_EQ(a.top, b.top) << where;
}

// The engine marks a sequence done (waking its client) before it books the step's statistics: the
// statistics once `finished` requests are booked and every KV slot is free (or after ~10 s).
inline EngineStats settled(Engine& e, int64_t finished) {
  EngineStats s = e.stats();
  for (int i = 0; i < 1000 && (s.requests_finished < finished || s.kv_tokens_used != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = e.stats();
  }
  return s;
}

}  // namespace jtok::testing
