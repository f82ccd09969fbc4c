// Attaching tables to a trained backbone (train/init_from.h) and training only them
// (model/trainable.h): the upgraded model (+JTok, +JTok-M, s = 0) computes the original's logits
// bit for bit, dense and MoE; with a frozen backbone no backbone tensor moves while the loss falls.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "core/error.h"
#include "infer/generate.h"
#include "model/trainable.h"
#include "model/transformer.h"
#include "model_test_util.h"
#include "train/checkpoint.h"
#include "train/init_from.h"
#include "train/optimizer.h"

using namespace jtok;
using jtok::testing::tokens;
namespace fs = std::filesystem;

namespace {

// A backbone with an MLP wide enough (F = 1536) that its down projection's GEMM spans several blocks
// of the reduction dimension: where the gated path's arithmetic would part from the plain one's.
Config base_config(bool moe) {
  Config c;
  ModelConfig& m = c.model;
  m.vocab_size = 96; m.vocab_pad_multiple = 32; m.hidden_size = 64; m.num_hidden_layers = 3;
  m.num_attention_heads = 4; m.num_key_value_heads = 2; m.intermediate_size = 1536; m.max_position_embeddings = 32;
  if (moe) {
    m.model_type = "jtok_moe"; m.first_k_dense_replace = 1; m.n_routed_experts = 4; m.n_shared_experts = 1;
    m.num_experts_per_tok = 2; m.moe_intermediate_size = 96;
  }
  c.train.seq_len = 16;
  return c;
}

// The base trained a little (random weights alone would do, but moved norms and residual scales are
// the realistic case) and saved as a checkpoint; returns its directory.
std::string save_base(const Config& cfg, Model& base, const char* name) {
  // Per process: suites of several checkouts may run at once on one machine.
  const std::string run = (fs::path(::testing::TempDir()) / (std::string(name) + "_" + std::to_string(::getpid()))).string();
  fs::remove_all(run);
  AdamWState opt = make_adamw_state(base);
  Config c = cfg;
  c.train.learning_rate = 1e-2;
  c.train.warmup_steps = 0;
  auto x = tokens(2 * 16, cfg.model.vocab_size, 1), y = tokens(2 * 16, cfg.model.vocab_size, 2);
  Activations a;
  for (int s = 0; s < 3; ++s) {
    zero_grads(base);
    forward(base, a, x.data(), 2, 16);
    backward(base, a, x.data(), y.data());
    optimizer_step(base, opt, c.train);
  }
  return save_checkpoint(run, 3, cfg, base, opt, {{"step", 3}, {"run_id", "base"}}, 1);
}

// The base's config with JTok on layers 0-1 and JTok-M on every layer, checked and its scalers set
// to 0 by plan_init_from, and the model built from it with the checkpoint's weights loaded.
Model upgraded(const std::string& ckpt, Config& cfg) {
  cfg.model.jtok = true; cfg.model.jtok_layers = "0-1";
  cfg.model.jtokm = true; cfg.model.jtokm_n_e = 3; cfg.model.jtokm_top_k = 2;
  const InitFromPlan plan = plan_init_from(ckpt, cfg.model, false, false);
  EXPECT_TRUE(plan.jtok_scale_zeroed && plan.jtokm_scale_zeroed);
  EXPECT_EQ(plan.jtok_attached.size(), 2u);
  EXPECT_EQ(plan.jtokm_attached.size(), 3u);
  Model m = make_model(cfg.model, 77);
  const auto fresh = load_init_weights(m, ckpt);
  EXPECT_EQ(fresh.size(), 2u + 3u * 2 + 2u + 3u * 3);  // JTok scalers, JTok-M routers + scalers, tables
  return m;
}

int64_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

class Attach : public ::testing::TestWithParam<bool> {};

TEST_P(Attach, UpgradedModelWithZeroScalersGivesTheOriginalLogitsBitForBit) {
  const bool moe = GetParam();
  Config cfg = base_config(moe);
  Model base = make_model(cfg.model, 5);
  const std::string ck = save_base(cfg, base, moe ? "attach_moe" : "attach_dense");
  Config up_cfg = cfg;
  Model up = upgraded(ck, up_cfg);
  const int64_t B = 2, T = 16;
  auto x = tokens(B * T, cfg.model.vocab_size, 9);
  Activations a, b;
  forward(base, a, x.data(), B, T);
  forward(up, b, x.data(), B, T);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  EXPECT_EQ(differing(a.logits, b.logits), 0) << "training forward";
  // The inference forward (eval, prefill) takes the same path.
  Activations ai, bi;
  forward_hidden(base, ai, x.data(), B, T, ForwardMode::Inference);
  forward_hidden(up, bi, x.data(), B, T, ForwardMode::Inference);
  EXPECT_EQ(differing(ai.lnf, bi.lnf), 0) << "inference forward";
  // KV-cache generation: prefill, then decoding steps (their own write-back, generate.cpp).
  KVCache ca, cb;
  const std::vector<int32_t> prompt(x.begin(), x.begin() + 8);
  std::vector<float> la = prefill(base, ca, prompt, 16), lb = prefill(up, cb, prompt, 16);
  EXPECT_EQ(differing(la, lb), 0) << "prefill";
  for (int i = 0; i < 4; ++i) {
    la = decode_step(base, ca, x[8 + i]);
    lb = decode_step(up, cb, x[8 + i]);
    EXPECT_EQ(differing(la, lb), 0) << "decode step " << i;
  }

  // Measured, not assumed: the gated path with p == 1 exactly (s = 1e-30 on one dimension: 1 + s n
  // rounds to 1) does not reproduce the plain bits, which is why a layer whose s is all 0 skips it.
  for (auto& L : up.w.layers)
    if (L.jtok_scale) L.jtok_scale[0] = 1e-30f;
  Activations g;
  forward(up, g, x.data(), B, T);
  const int64_t n = differing(a.logits, g.logits);
  std::printf("[measure] %s: gated path with p == 1: %lld of %zu logits differ from the plain model's\n",
              moe ? "moe" : "dense", static_cast<long long>(n), a.logits.size());
  EXPECT_GT(n, 0) << "the gated path matches now: the s == 0 special case could go";
}

TEST_P(Attach, BackwardThroughTheUngatedPathGivesTheGatedPathsGradients) {
  // At s = 0 the forward skips the gate but keeps mlp_out for the backward: the scalers' gradients
  // equal those of the gated path (s = 1e-30 on one dimension) up to the forward's rounding.
  const bool moe = GetParam();
  Config cfg = base_config(moe);
  Model base = make_model(cfg.model, 5);
  const std::string ck = save_base(cfg, base, moe ? "attach_bwd_moe" : "attach_bwd_dense");
  Config up_cfg = cfg;
  Model up = upgraded(ck, up_cfg);
  auto x = tokens(32, cfg.model.vocab_size, 3), y = tokens(32, cfg.model.vocab_size, 4);
  auto grads_of = [&](Model& m) {
    zero_grads(m);
    Activations a;
    forward(m, a, x.data(), 2, 16);
    backward(m, a, x.data(), y.data());
    return std::vector<float>(m.grads.begin(), m.grads.end());
  };
  const auto g0 = grads_of(up);
  for (auto& L : up.w.layers)
    if (L.jtok_scale) L.jtok_scale[0] = 1e-30f;
  const auto g1 = grads_of(up);
  for (const ParamInfo& p : up.layout) {
    if (p.name.find(".jtok.scale") == std::string::npos) continue;
    std::vector<float> a(g0.begin() + p.offset, g0.begin() + p.offset + p.numel);
    std::vector<float> b(g1.begin() + p.offset, g1.begin() + p.offset + p.numel);
    double norm = 0;
    for (float v : a) norm += double(v) * v;
    EXPECT_GT(norm, 0) << p.name << ": s = 0 must still get a gradient";
    EXPECT_LT(jtok::testing::rel_err(a, b), 1e-4) << p.name;
  }
}

TEST_P(Attach, FrozenBackboneStaysBitIdenticalWhileTheLossFalls) {
  const bool moe = GetParam();
  Config cfg = base_config(moe);
  Model base = make_model(cfg.model, 5);
  const std::string ck = save_base(cfg, base, moe ? "attach_frozen_moe" : "attach_frozen_dense");
  Config up_cfg = cfg;
  Model up = upgraded(ck, up_cfg);
  up.backbone_frozen = true;
  up_cfg.train.train_only = "tables";
  up_cfg.train.learning_rate = 1e-2;
  up_cfg.train.table_learning_rate = 3e-2;
  up_cfg.train.warmup_steps = 0;
  up_cfg.train.lr_scheduler_type = "constant";
  AdamWState opt = make_adamw_state(up);
  // Moments only for the modules' flat tensors (scalers, routers): none for the backbone.
  int64_t trainable = 0;
  for (const ParamInfo& p : up.layout) trainable += is_token_indexed_param(p.name) ? p.numel : 0;
  EXPECT_EQ(static_cast<int64_t>(opt.m.size()), trainable);
  const std::vector<float> before(up.params.begin(), up.params.end());
  auto x = tokens(32, cfg.model.vocab_size, 3), y = tokens(32, cfg.model.vocab_size, 4);
  Activations a;
  double first = 0, last = 0;
  for (int s = 0; s < 12; ++s) {
    zero_grads(up);
    forward(up, a, x.data(), 2, 16);
    const double loss = backward(up, a, x.data(), y.data());
    if (s == 0) first = loss;
    last = loss;
    for (const ParamInfo& p : up.layout) {  // no weight-gradient product reached a frozen tensor
      if (param_trainable(up, p)) continue;
      for (int64_t i = 0; i < p.numel; ++i) ASSERT_EQ(up.grads[p.offset + i], 0.0f) << p.name;
    }
    optimizer_step(up, opt, up_cfg.train);
  }
  sync_tables(up, opt);
  int64_t moved = 0;
  for (const ParamInfo& p : up.layout) {
    const int64_t n = std::memcmp(up.params.data() + p.offset, before.data() + p.offset, sizeof(float) * p.numel) != 0;
    if (param_trainable(up, p)) {
      moved += n;
    } else {
      EXPECT_EQ(n, 0) << p.name << " moved";
    }
  }
  EXPECT_GT(moved, 0);
  EXPECT_LT(last, first - 0.05) << "the tables, scalers and routers should fit the batch";
}

TEST(AttachTableLr, TableLearningRateScalesOnlyTheTokenIndexedModules) {
  // table_learning_rate 0: the backbone trains at learning_rate, the tables, scalers and routers do
  // not move at all (lr 0 also leaves the weight decay factor at exactly 1).
  Config cfg = base_config(false);
  cfg.model.jtok = cfg.model.jtokm = true;
  cfg.model.jtokm_n_e = 2; cfg.model.jtokm_top_k = 1;
  cfg.train.learning_rate = 1e-2;
  cfg.train.table_learning_rate = 0;
  cfg.train.warmup_steps = 0;
  Model m = make_model(cfg.model, 3);
  AdamWState opt = make_adamw_state(m);
  const std::vector<float> before(m.params.begin(), m.params.end());
  std::vector<std::vector<float>> tables_before;
  for (const TokenTable& t : m.tables) tables_before.emplace_back(t.data(), t.data() + t.numel());
  auto x = tokens(32, cfg.model.vocab_size, 3), y = tokens(32, cfg.model.vocab_size, 4);
  Activations a;
  for (int s = 0; s < 3; ++s) {
    zero_grads(m);
    forward(m, a, x.data(), 2, 16);
    backward(m, a, x.data(), y.data());
    const StepStats st = optimizer_step(m, opt, cfg.train);
    EXPECT_EQ(st.table_lr, 0.0);
    EXPECT_GT(st.lr, 0.0);
  }
  sync_tables(m, opt);
  for (const ParamInfo& p : m.layout) {
    const bool same = std::memcmp(m.params.data() + p.offset, before.data() + p.offset, sizeof(float) * p.numel) == 0;
    EXPECT_EQ(same, is_token_indexed_param(p.name)) << p.name;
  }
  for (size_t k = 0; k < m.tables.size(); ++k)
    EXPECT_EQ(std::memcmp(m.tables[k].data(), tables_before[k].data(), sizeof(float) * tables_before[k].size()), 0)
        << m.table_names[k];
}

INSTANTIATE_TEST_SUITE_P(Backbones, Attach, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "moe" : "dense"; });

TEST(AttachErrors, BackboneFieldThatDiffersIsNamed) {
  Config cfg = base_config(false);
  Model base = make_model(cfg.model, 5);
  const std::string ck = save_base(cfg, base, "attach_err");
  ModelConfig other = cfg.model;
  other.intermediate_size = 128;
  other.jtok = true;
  try {
    plan_init_from(ck, other, false, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("field intermediate_size is 1536"), std::string::npos) << e.what();
  }
  // A model without a layer the checkpoint has: its tensors have no place.
  ModelConfig fewer = cfg.model;
  fewer.num_hidden_layers = 2;
  Model small = make_model(fewer, 1);
  try {
    load_init_weights(small, ck);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2."), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has no place"), std::string::npos) << e.what();
  }
  // A checkpoint lacking a backbone tensor the model needs (a wider model: shapes differ).
  ModelConfig wider = cfg.model;
  wider.hidden_size = 128;
  Model w = make_model(wider, 1);
  try {
    load_init_weights(w, ck);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape"), std::string::npos) << e.what();
  }
}

}  // namespace
