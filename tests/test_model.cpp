// Whole-model checks that need no PyTorch: backward vs finite differences on every tensor,
// gradient accumulation, padded vocabulary rows, tied embeddings.
#include <gtest/gtest.h>

#include <ostream>

#include <random>

#include "model_test_util.h"
#include "op_test_util.h"
#include "core/error.h"
#include "model/activation_bytes.h"
#include "model/transformer.h"

using namespace jtok;
using namespace jtok::testing;

static ModelConfig tiny(bool tied, bool jtok = false, bool jtok_norm = true) {
  ModelConfig c;
  c.vocab_size = 50;
  c.vocab_pad_multiple = 16;  // Vp = 64
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 24;
  c.max_position_embeddings = 16;
  c.tie_word_embeddings = tied;
  c.initializer_range = 0.3;  // large weights: large, well-measurable gradients
  c.jtok = jtok;
  c.jtok_norm = jtok_norm;
  c.jtok_layers = "1";
  c.jtok_init_std = 0.5;
  c.jtok_scale_init = 1.5;
  return c;
}

// jtokm: 0 off, 1 on (norm, depth scaling), 2 on without norm and depth scaling (the ablations).
// variants: the backbone variants of imported models on (with_variants), their vectors random.
struct GradCase { bool tied, jtok, jtok_norm; int jtokm = 0; bool variants = false; };
// Test names show the case, not its raw bytes (padding made them differ from build to build).
void PrintTo(const GradCase& c, std::ostream* os) {
  *os << "tied=" << c.tied << " jtok=" << c.jtok << " jtok_norm=" << c.jtok_norm << " jtokm=" << c.jtokm
      << " variants=" << c.variants;
}
class ModelGrad : public ::testing::TestWithParam<GradCase> {};

TEST_P(ModelGrad, BackwardMatchesFiniteDifferencesOnEveryTensor) {
  ModelConfig c = tiny(GetParam().tied, GetParam().jtok, GetParam().jtok_norm);
  if (GetParam().jtokm) {
    c.jtokm = true;
    c.jtokm_layers = "all";
    c.jtokm_n_e = 3;
    c.jtokm_top_k = 2;
    c.jtokm_init_std = 0.5;
    c.jtokm_scale_init = 1.5;
    c.jtokm_aux_loss_coef = 0.5;  // large: the aux gradient is measurable
    c.jtokm_norm = c.jtokm_depth_scaling = GetParam().jtokm == 1;
  }
  if (GetParam().variants) c = with_variants(c);
  Model m = make_model(c, 7);
  if (GetParam().variants) randomize_variant_params(m, 8);
  const int64_t B = 2, T = 6;
  auto x = tokens(B * T, c.vocab_size, 1), y = tokens(B * T, c.vocab_size, 2);
  Activations a;
  forward(m, a, x.data(), B, T);
  zero_grads(m);
  backward(m, a, x.data(), y.data());
  if (c.jtokm) {
    EXPECT_GT(a.jtokm_aux_loss, 0.0);
  }
  // The step's loss: LM + aux (JTok-M's load balancing; 0 without it).
  auto loss = [&] { forward(m, a, x.data(), B, T); return loss_of_logits(m, a, y.data()) + a.aux_loss; };
  std::mt19937_64 rng(3);
  for (const auto& p : m.layout) {
    // Up to 12 elements of each tensor, real rows only for vocabulary tensors.
    std::vector<float> analytic, numeric;
    int64_t limit = p.numel;
    if (p.name.find("embed") != std::string::npos || p.name.find("lm_head") != std::string::npos)
      limit = c.vocab_size * c.hidden_size;
    for (int k = 0; k < 12; ++k) {
      int64_t i = p.offset + static_cast<int64_t>(rng() % limit);
      analytic.push_back(m.grads[i]);
      numeric.push_back(central_difference(m.params[i], loss));
    }
    EXPECT_LT(rel_err(analytic, numeric), 2e-2) << p.name;
  }
  // Token-indexed tables: finite differences on rows the batch uses; the sparse gradient has no other rows.
  ASSERT_EQ(m.tables.size(), static_cast<size_t>(c.jtok_num_layers() + c.jtokm_num_layers() * (c.jtokm ? c.jtokm_n_e : 0)));
  for (size_t l = 0; l < m.tables.size(); ++l) {
    auto& t = m.tables[l];
    std::vector<float> dense = densify(m.table_grads[l], t.rows), analytic, numeric;
    for (int k = 0; k < 16; ++k) {
      const int64_t i = static_cast<int64_t>(x[rng() % x.size()]) * c.hidden_size + static_cast<int64_t>(rng() % c.hidden_size);
      analytic.push_back(dense[i]);
      numeric.push_back(central_difference(t.mutable_values()[i], loss));
    }
    EXPECT_LT(rel_err(analytic, numeric), 2e-2) << m.table_names[l];
    EXPECT_LE(m.table_grads[l].ids.size(), x.size());
  }
  EXPECT_EQ(c.jtok_num_layers(), c.jtok ? 1 : 0);
  // Padded rows of the vocabulary tensors get exactly zero gradient.
  const auto& head = find_param(m, c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  for (int64_t r = c.vocab_size; r < c.padded_vocab(); ++r)
    for (int64_t j = 0; j < c.hidden_size; ++j) EXPECT_EQ(m.grads[head.offset + r * c.hidden_size + j], 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Variants, ModelGrad,
                         ::testing::Values(GradCase{false, false, true}, GradCase{true, false, true},
                                           GradCase{false, true, true}, GradCase{true, true, false},
                                           GradCase{false, false, true, 1}, GradCase{true, true, true, 1},
                                           GradCase{false, false, true, 2}, GradCase{false, false, true, 0, true},
                                           GradCase{true, true, true, 1, true}));

TEST(Model, GradientAccumulationEqualsOneBigBatch) {
  ModelConfig c = tiny(false);
  Model m = make_model(c, 11);
  expect_accumulation_equals_big_batch(m, 2, 8);
}

TEST(Model, RejectsTokenOutsideVocabulary) {
  ModelConfig c = tiny(false);
  Model m = make_model(c, 1);
  std::vector<int32_t> x = {1, 2, 50};
  Activations a;
  EXPECT_THROW(forward(m, a, x.data(), 1, 3), Error);
}

// The activation memory that `jtok flops` reports from the config alone equals, component by
// component, the buffers a forward + backward really allocate, when the batch's ids are all distinct
// (the accounting's worst case for token-table rows): dense, JTok + JTok-M, MoE (shared experts)
// with JTok + JTok-M on some layers, and Qwen3's qk_norm with JTok + JTok-M.
TEST(ActivationBytes, ConfigAccountingEqualsTheAllocatedBuffers) {
  for (int variant = 0; variant < 4; ++variant) {
    ModelConfig c = tiny(false, variant > 0);
    c.qk_norm = variant == 3;
    if (variant > 0) {
      c.jtokm = true;
      c.jtokm_layers = "0";
      c.jtokm_n_e = 3;
      c.jtokm_top_k = 2;
    }
    if (variant == 2) {
      c.model_type = "jtok_moe";
      c.num_hidden_layers = 3;
      c.first_k_dense_replace = 1;
      c.n_routed_experts = 5;
      c.n_shared_experts = 1;
      c.num_experts_per_tok = 2;
      c.moe_intermediate_size = 12;
      c.jtok_layers = "2";
      c.jtokm_layers = "1,2";
    }
    Model m = make_model(c, 7);
    const int64_t B = 3, T = 16, N = B * T;  // N = 48 distinct ids of the 50
    std::vector<int32_t> x(N), y(N);
    for (int64_t n = 0; n < N; ++n) x[n] = static_cast<int32_t>((n * 7) % c.vocab_size), y[n] = static_cast<int32_t>(n % 5);
    Activations a;
    forward(m, a, x.data(), B, T);
    zero_grads(m);
    backward(m, a, x.data(), y.data());
    const ActivationBytes want = activation_bytes(c, B, T), got = measured_activation_bytes(a, c);
    EXPECT_EQ(got.residual, want.residual) << "variant " << variant;
    EXPECT_EQ(got.attention, want.attention) << "variant " << variant;
    EXPECT_EQ(got.mlp, want.mlp) << "variant " << variant;
    EXPECT_EQ(got.tables, want.tables) << "variant " << variant;
    EXPECT_EQ(got.logits, want.logits) << "variant " << variant;
    EXPECT_EQ(got.attention_probs_txt, want.attention_probs_txt);
    // O(T) attention state: per layer (B,H,T) floats of log-sum-exp, not (B,H,T,T) probabilities.
    for (const auto& l : a.layers) EXPECT_EQ(static_cast<int64_t>(l.lse.size()), B * c.num_attention_heads * T);
  }
}

// Forward-only (prefill) activations: one layer's buffers serve every layer, every k and v is
// kept. The final hidden states and every layer's k and v equal the training forward's bit for
// bit, for dense, JTok, JTok-M and MoE models; backward after it is refused.
TEST(Model, InferenceForwardEqualsTrainingForward) {
  for (int variant = 0; variant < 4; ++variant) {
    ModelConfig c;
    c.vocab_size = 50; c.vocab_pad_multiple = 8; c.hidden_size = 16; c.num_hidden_layers = 3;
    c.num_attention_heads = 4; c.num_key_value_heads = 2; c.intermediate_size = 24; c.max_position_embeddings = 32;
    if (variant == 1) { c.jtok = true; c.jtok_layers = "0,2"; c.jtok_scale_init = 0.8; }
    if (variant == 2) { c.jtokm = true; c.jtokm_layers = "1-2"; c.jtokm_n_e = 3; c.jtokm_top_k = 2; c.jtokm_scale_init = 2.0; }
    if (variant == 3) {
      c.model_type = "jtok_moe"; c.first_k_dense_replace = 1; c.n_routed_experts = 4; c.num_experts_per_tok = 2;
      c.moe_intermediate_size = 8; c.jtok = true; c.jtok_layers = "2";
    }
    Model m = make_model(c, 11);
    const int64_t B = 2, T = 9;
    const auto x = jtok::testing::tokens(B * T, c.vocab_size, 3);
    Activations train, infer;
    forward_hidden(m, train, x.data(), B, T);
    forward_hidden(m, infer, x.data(), B, T, ForwardMode::Inference);
    EXPECT_EQ(train.lnf, infer.lnf) << "variant " << variant;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      EXPECT_EQ(train.layers[l].k, infer.layers[l].k) << "variant " << variant << " layer " << l;
      EXPECT_EQ(train.layers[l].v, infer.layers[l].v) << "variant " << variant << " layer " << l;
    }
    EXPECT_TRUE(infer.layers[1].h_in.empty());  // not kept per layer
    EXPECT_TRUE(infer.dh.empty());               // no backward scratch for a forward-only pass
  }
}

TEST(Model, BackwardAfterInferenceForwardIsRefused) {
  ModelConfig c;
  c.vocab_size = 50; c.vocab_pad_multiple = 8; c.hidden_size = 16; c.num_hidden_layers = 2;
  c.num_attention_heads = 4; c.num_key_value_heads = 2; c.intermediate_size = 24; c.max_position_embeddings = 32;
  Model m = make_model(c, 11);
  const auto x = jtok::testing::tokens(8, c.vocab_size, 3);
  Activations a;
  forward_hidden(m, a, x.data(), 1, 8, ForwardMode::Inference);
  EXPECT_THROW(backward(m, a, x.data(), x.data()), Error);
  forward(m, a, x.data(), 1, 8);  // back to training mode: backward works
  zero_grads(m);
  EXPECT_GT(backward(m, a, x.data(), x.data()), 0.0);
}
