// Inference with a KV cache: prefill a prompt, then decode one token at a time.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "model/transformer.h"

namespace jtok {

// Keys (after RoPE) and values of every layer for one sequence: (Tmax, KV, hd) each.
struct KVCache {
  int64_t len = 0, capacity = 0;
  std::vector<std::vector<float>> k, v;  // per layer
};

// Runs the prompt (all positions at once) and fills the cache; returns the last position's
// logits over the real vocabulary.
std::vector<float> prefill(const Model& m, KVCache& cache, const std::vector<int32_t>& prompt, int64_t capacity);
// Appends one token at position cache.len; returns its logits over the real vocabulary.
std::vector<float> decode_step(const Model& m, KVCache& cache, int32_t token);

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
};
// Picks the next token from logits; ties in greedy go to the lowest id.
int32_t sample_token(const std::vector<float>& logits, const SamplingParams& p, std::mt19937_64& rng);

}  // namespace jtok
