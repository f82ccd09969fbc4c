// jtok export --fold-jtok: the folded model (G = s * Norm(E) in the table, s = 1, no norm) gives
// the logits of the unfolded one to float rounding; JTok-M tables and the backbone are untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>

#include "export/fold.h"
#include "infer/generate.h"
#include "model_test_util.h"

using namespace jtok;

static ModelConfig cfg() {
  ModelConfig c =
      jtok::testing::tiny_jtok_config({.layers = 3, .context = 32, .jtok_layers = "0,2", .jtokm_layers = "1"});
  c.initializer_range = 0.2;
  c.jtok_scale_init = 0.8;
  c.jtokm_scale_init = 2.0;
  return c;
}

TEST(Export, FoldedJTokGivesTheSameLogits) {
  for (bool norm : {true, false}) {
    ModelConfig c = cfg();
    c.jtok_norm = norm;
    Model m = make_model(c, 3);
    // Scalers away from their constant init, so folding s in is really tested.
    for (int64_t l : {0, 2})
      for (int64_t j = 0; j < c.hidden_size; ++j) m.w.layers[l].jtok_scale[j] = 0.5f + 0.05f * static_cast<float>(j % 7);
    Model f = m;
    f.w = bind_view(f.params.data(), f.layout, f.cfg);
    EXPECT_EQ(fold_jtok(f), 2);
    EXPECT_FALSE(f.cfg.jtok_norm);
    for (int64_t j = 0; j < c.hidden_size; ++j) EXPECT_EQ(f.w.layers[2].jtok_scale[j], 1.0f);
    EXPECT_NE(f.tables[m.jtok_table[0]].to_vector(), m.tables[m.jtok_table[0]].to_vector());
    for (int i = 0; i < 3; ++i)  // JTok-M's tables: untouched
      EXPECT_EQ(f.tables[m.jtokm_table[1] + i].to_vector(), m.tables[m.jtokm_table[1] + i].to_vector());
    std::vector<int32_t> ids = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26};
    Activations a, b;
    forward(m, a, ids.data(), 2, 6);
    forward(f, b, ids.data(), 2, 6);
    double max_diff = 0, max_abs = 0;
    for (size_t i = 0; i < a.logits.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(static_cast<double>(a.logits[i]) - b.logits[i]));
      max_abs = std::max(max_abs, std::abs(static_cast<double>(a.logits[i])));
    }
    EXPECT_LT(max_diff, 1e-5) << "norm " << norm;
    EXPECT_GT(max_abs, 0.1);
  }
}

TEST(Export, NothingToFoldWithoutJTok) {
  ModelConfig c = cfg();
  c.jtok = false;
  Model m = make_model(c, 1);
  EXPECT_EQ(fold_jtok(m), 0);
  EXPECT_TRUE(m.cfg.jtok_norm);
}

// bf16 / int8 tables (jtok export --table-dtype) against f32, on a small JTok + JTok-M model whose
// tables matter (scalers 0.8 and 2.0): logits within a stated tolerance of f32 (relative to the
// largest logit: bf16 2e-3, int8 2e-2), and greedy decoding gives the same first 24 tokens.
TEST(Export, QuantizedTablesStayCloseToF32AndDecodeTheSameGreedyTokens) {
  ModelConfig c = cfg();
  c.max_position_embeddings = 40;
  Model m = make_model(c, 5);
  std::vector<int32_t> ids = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26};
  Activations a;
  forward(m, a, ids.data(), 2, 6);
  auto greedy = [&](const Model& model) {
    KVCache kv;
    std::mt19937_64 rng(0);  // unused by greedy
    std::vector<float> l = prefill(model, kv, {3, 14, 15, 92}, 40);
    std::vector<int32_t> out;
    for (int i = 0; i < 24; ++i) {
      out.push_back(sample_token(l, SamplingParams{.temperature = 0}, rng));
      l = decode_step(model, kv, out.back());
    }
    return out;
  };
  const std::vector<int32_t> ref_tokens = greedy(m);
  EXPECT_GT(std::set<int32_t>(ref_tokens.begin(), ref_tokens.end()).size(), 3u);  // not one token repeated
  for (Dtype dt : {Dtype::bf16, Dtype::int8}) {
    SCOPED_TRACE(dtype_name(dt));
    Model q = m;
    q.w = bind_view(q.params.data(), q.layout, q.cfg);
    for (auto& t : q.tables) t = quantize_table(t, dt);
    Activations b;
    forward(q, b, ids.data(), 2, 6);
    double max_diff = 0, max_abs = 0;
    for (size_t i = 0; i < a.logits.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(static_cast<double>(a.logits[i]) - b.logits[i]));
      max_abs = std::max(max_abs, std::abs(static_cast<double>(a.logits[i])));
    }
    std::printf("%s tables: max |logit - f32| %.3g (largest logit %.3g)\n", dtype_name(dt), max_diff, max_abs);
    EXPECT_GT(max_diff, 0.0);  // the tables really changed
    EXPECT_LT(max_diff, (dt == Dtype::bf16 ? 2e-3 : 2e-2) * max_abs);
    EXPECT_EQ(greedy(q), ref_tokens);
  }
}
