// Helpers for whole-model tests: random token ids, and the gradient-accumulation check.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "op_test_util.h"

namespace jtok::testing {

// A small JTok + JTok-M model for whole-model tests: 4 query and 2 KV heads, JTok on jtok_layers,
// JTok-M (n_e 3, top-2) on jtokm_layers, every other field its default.
struct TinyJtokShape {
  int64_t vocab = 97, hidden = 32, layers = 2, intermediate = 48, context = 48;
  std::string jtok_layers = "1", jtokm_layers = "0";
};

inline ModelConfig tiny_jtok_config(const TinyJtokShape& s) {
  ModelConfig c;
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = s.intermediate;
  c.max_position_embeddings = s.context;
  c.jtok = true;
  c.jtok_layers = s.jtok_layers;
  c.jtokm = true;
  c.jtokm_layers = s.jtokm_layers;
  c.jtokm_n_e = 3;
  c.jtokm_top_k = 2;
  return c;
}

// c on the MoE backbone: layer 0 dense, then 4 routed experts (top-2) and one shared, moe_width wide.
inline ModelConfig with_small_moe(ModelConfig c, int64_t moe_width) {
  c.model_type = "jtok_moe";
  c.first_k_dense_replace = 1;
  c.n_routed_experts = 4;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = moe_width;
  return c;
}

// c with every backbone variant of imported models on (docs/model.md "Variants"): Qwen3's q/k norm,
// Qwen2's q/k/v biases, Llama 3's rope scaling with an original context of 8 (so that short test
// sequences reach both its scaled and blended bands), and a head_dim apart from hidden/heads.
inline ModelConfig with_variants(ModelConfig c) {
  c.qk_norm = c.attention_bias = true;
  c.rope_scaling_type = "llama3";
  c.rope_scaling_original_max_position_embeddings = 8;
  c.head_dim = c.hidden_size / c.num_attention_heads + 2;
  return c;
}

// The variants' vectors drawn at random (biases N(0, 0.3), q/k norm gains 1 + N(0, 0.3)): at their
// init (0 and 1) a bias or gain left out of a forward path would change nothing.
inline void randomize_variant_params(Model& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.3f);
  for (const ParamInfo& p : m.layout) {
    const bool bias = p.name.ends_with("_proj.bias"), gain = p.name.ends_with("_norm.weight") &&
                                                            p.name.find("self_attn.") != std::string::npos;
    if (!bias && !gain) continue;
    for (int64_t i = 0; i < p.numel; ++i) m.params[p.offset + i] = (gain ? 1.0f : 0.0f) + dist(rng);
  }
}

inline std::vector<int32_t> tokens(int64_t n, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
  return t;
}

// Two micro-batches of (B,T), each backpropagated with scale 1/2, give the loss and gradients of
// one (2B,T) batch.
inline void expect_accumulation_equals_big_batch(Model& m, int64_t B, int64_t T) {
  const int64_t V = m.cfg.vocab_size;
  auto x = tokens(2 * B * T, V, 4), y = tokens(2 * B * T, V, 5);
  Activations a;
  zero_grads(m);
  forward(m, a, x.data(), 2 * B, T);
  double big = backward(m, a, x.data(), y.data());
  auto g_big = m.grads;
  zero_grads(m);
  Activations a2;
  double acc = 0;
  for (int mb = 0; mb < 2; ++mb) {
    forward(m, a2, x.data() + mb * B * T, B, T);
    acc += backward(m, a2, x.data() + mb * B * T, y.data() + mb * B * T, 0.5f) / 2;
  }
  EXPECT_NEAR(acc, big, 1e-5);
  EXPECT_LT(rel_err(m.grads, g_big), 1e-5);
}

}  // namespace jtok::testing
