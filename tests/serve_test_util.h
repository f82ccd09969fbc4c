// Helpers of the serving engine's tests (test_serve_engine, test_serve_logprobs): a tiny JTok +
// JTok-M model, what `jtok generate` gives for one request alone, and waiting for a sequence.
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "infer/generate.h"
#include "infer/logprobs.h"
#include "serve/engine.h"

namespace jtok::testing {

inline ModelConfig tiny_serve_config() {
  ModelConfig c;
  c.vocab_size = 97;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 48;
  c.max_position_embeddings = 48;
  c.initializer_range = 0.2;
  c.jtok = true;
  c.jtok_layers = "1";
  c.jtokm = true;
  c.jtokm_layers = "0";
  c.jtokm_n_e = 3;
  c.jtokm_top_k = 2;
  c.jtokm_scale_init = 2.0;
  return c;
}

struct Alone {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> lps;
};

// What `jtok generate` does for one request (prefill, then sample / decode_step), with the
// log-prob of each sampled token from the logits it was sampled from.
inline Alone alone(const Model& m, const GenerationRequest& r, bool kv_bf16 = false) {
  KVCache cache;
  cache.bf16 = kv_bf16;
  std::mt19937_64 rng(r.seed);
  std::vector<float> l = prefill(m, cache, r.prompt, static_cast<int64_t>(r.prompt.size()) + r.max_tokens);
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

}  // namespace jtok::testing
