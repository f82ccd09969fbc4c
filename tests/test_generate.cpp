// Greedy decoding with the KV cache gives the same tokens (and logits) as recomputing the full
// forward over the whole sequence at every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "op_test_util.h"
#include "decode_test_util.h"
#include "model_test_util.h"
#include "core/error.h"
#include "infer/generate.h"
#include "infer/generate_run.h"
#include "ops/lowp_linear.h"

using namespace jtok;
using namespace jtok::testing;

namespace {
// Greedy decoding of model c from a fixed prompt: the cached logits of every step equal the
// last-position logits of a full forward over the whole sequence.
void check_cache_equals_recompute(const Model& m) {
  const ModelConfig& c = m.cfg;
  std::vector<int32_t> seq = {3, 14, 15, 92, 65};
  KVCache cache;
  std::vector<float> logits = prefill(m, cache, seq, 40);
  std::mt19937_64 rng(0);
  SamplingParams greedy{0.0, 0, 1.0};
  int distinct = 0;
  for (int step = 0; step < 20; ++step) {
    // Full recompute of the last position's logits.
    Activations a;
    forward(m, a, seq.data(), 1, static_cast<int64_t>(seq.size()));
    const int64_t T = static_cast<int64_t>(seq.size()), Vp = c.padded_vocab();
    std::vector<float> full(a.logits.begin() + (T - 1) * Vp, a.logits.begin() + (T - 1) * Vp + c.vocab_size);
    EXPECT_LT(rel_err(logits, full), 1e-5) << "step " << step;
    int32_t next = sample_token(logits, greedy, rng);
    ASSERT_EQ(next, sample_token(full, greedy, rng)) << "step " << step;
    distinct += next != seq.back();
    seq.push_back(next);
    logits = decode_step(m, cache, next);
  }
  EXPECT_GT(distinct, 0);
}

void check_cache_equals_recompute(const ModelConfig& c) { check_cache_equals_recompute(make_model(c, 5)); }

ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 97;
  c.hidden_size = 32;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 48;
  c.max_position_embeddings = 40;
  c.initializer_range = 0.2;
  return c;
}

// small_config with JTok on layers 0 and 2 and JTok-M (4 tables, top 2, a large injection) on 1-2.
ModelConfig jtok_jtokm_config() {
  ModelConfig c = small_config();
  c.jtok = true;
  c.jtok_layers = "0,2";
  c.jtok_scale_init = 0.8;
  c.jtokm = true;
  c.jtokm_layers = "1-2";
  c.jtokm_n_e = 4;
  c.jtokm_top_k = 2;
  c.jtokm_init_std = 0.3;
  c.jtokm_scale_init = 3.0;
  return c;
}

// c on the MoE backbone: layer 0 dense, then 6 routed experts of width 16, top 2.
ModelConfig on_moe(ModelConfig c) {
  c.model_type = "jtok_moe";
  c.first_k_dense_replace = 1;
  c.n_routed_experts = 6;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  return c;
}
}  // namespace

TEST(Generate, KVCacheGreedyEqualsFullRecompute) { check_cache_equals_recompute(small_config()); }

// decode_step must apply the JTok gate of the decoded token (layers 0 and 2 here), as forward does.
TEST(Generate, KVCacheGreedyEqualsFullRecomputeWithJTok) {
  ModelConfig c = small_config();
  c.jtok = true;
  c.jtok_layers = "0,2";
  c.jtok_scale_init = 0.8;
  check_cache_equals_recompute(c);
}

TEST(Generate, KVCacheGreedyEqualsFullRecomputeMoe) {
  ModelConfig c = small_config();
  c.model_type = "jtok_moe";
  c.first_k_dense_replace = 1;
  c.n_routed_experts = 6;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.jtok = true;  // MoE update gated by JTok too
  check_cache_equals_recompute(c);
}

TEST(Generate, KVCacheGreedyEqualsFullRecomputeWithJTokM) {
  ModelConfig c = small_config();
  c.jtokm = true;
  c.jtokm_layers = "1-2";
  c.jtokm_n_e = 4;
  c.jtokm_top_k = 2;
  c.jtokm_init_std = 0.3;
  c.jtokm_scale_init = 3.0;  // a large injection, so a routing mistake changes the greedy tokens
  check_cache_equals_recompute(c);
  c.model_type = "jtok_moe";  // and on the MoE backbone, with JTok beside it
  c.first_k_dense_replace = 1;
  c.n_routed_experts = 6;
  c.moe_intermediate_size = 16;
  c.jtok = true;
  check_cache_equals_recompute(c);
}

TEST(Generate, SamplingRespectsTopKAndTopP) {
  std::vector<float> logits = {0.0f, 5.0f, 4.9f, -3.0f, 1.0f};
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200; ++i) {
    int32_t t = sample_token(logits, {1.0, 2, 1.0}, rng);
    EXPECT_TRUE(t == 1 || t == 2);
    EXPECT_EQ(sample_token(logits, {1.0, 0, 0.3}, rng), 1);  // top-p 0.3: only the best token
  }
  EXPECT_EQ(sample_token(logits, {0.0, 0, 1.0}, rng), 1);
  // Plain temperature sampling follows softmax(logits / T): token 3 (logit -3) is rare, 1 and 2 common.
  std::vector<int> count(logits.size(), 0);
  for (int i = 0; i < 4000; ++i) count[static_cast<size_t>(sample_token(logits, {1.0, 0, 1.0}, rng))]++;
  EXPECT_GT(count[1], 1400);
  EXPECT_GT(count[2], 1300);
  EXPECT_LT(count[3], 20);
  EXPECT_GT(count[0] + count[4], 30);
}

TEST(Generate, ContextOverflowIsAnError) {
  ModelConfig c;
  c.vocab_size = 10; c.hidden_size = 8; c.num_hidden_layers = 1; c.num_attention_heads = 2;
  c.num_key_value_heads = 2; c.intermediate_size = 8; c.max_position_embeddings = 4;
  Model m = make_model(c, 1);
  KVCache cache;
  prefill(m, cache, {1, 2, 3}, 4);
  decode_step(m, cache, 4);
  EXPECT_THROW(decode_step(m, cache, 5), Error);
}

namespace {
// Continuous batching: sequences at different positions (prompts of different lengths, joining at
// different steps) decoded together by decode_batch give the same greedy tokens as each decoded
// alone with decode_step, and logits equal to rounding (the batched GEMMs sum in another order).
void check_batched_equals_alone(const ModelConfig& c) {
  Model m = make_model(c, 11);
  const std::vector<std::vector<int32_t>> prompts = {{3, 14, 15}, {92}, {65, 35, 89, 79, 32, 38}, {3, 14, 15}, {7, 7}};
  const int steps = 12;
  SamplingParams greedy{0.0, 0, 1.0};
  std::mt19937_64 rng(0);
  // Alone.
  std::vector<std::vector<int32_t>> alone(prompts.size());
  std::vector<std::vector<std::vector<float>>> alone_logits(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) {
    KVCache cache;
    std::vector<float> l = prefill(m, cache, prompts[s], 40);
    for (int i = 0; i < steps; ++i) {
      alone[s].push_back(sample_token(l, greedy, rng));
      alone_logits[s].push_back(l);
      if (i + 1 < steps) l = decode_step(m, cache, alone[s].back());
    }
  }
  // Together: sequence s joins at step s (prefilled alone, as the server does), then every active
  // sequence advances in one decode_batch per step.
  std::vector<KVCache> caches(prompts.size());
  std::vector<std::vector<int32_t>> together(prompts.size());
  std::vector<std::vector<float>> last(prompts.size());
  std::vector<float> logits;
  int distinct = 0;
  for (int step = 0; step < steps + static_cast<int>(prompts.size()); ++step) {
    if (step < static_cast<int>(prompts.size())) last[step] = prefill(m, caches[step], prompts[step], 40);
    std::vector<KVCache*> batch;
    std::vector<int32_t> tokens;
    std::vector<size_t> who;
    for (size_t s = 0; s < prompts.size() && static_cast<int>(s) <= step; ++s) {
      if (together[s].size() == static_cast<size_t>(steps)) continue;
      const size_t i = together[s].size();
      EXPECT_LT(rel_err(last[s], alone_logits[s][i]), 1e-5) << "sequence " << s << " token " << i;
      together[s].push_back(sample_token(last[s], greedy, rng));
      if (together[s].size() == static_cast<size_t>(steps)) continue;
      batch.push_back(&caches[s]);
      tokens.push_back(together[s].back());
      who.push_back(s);
    }
    if (batch.empty()) continue;
    distinct += batch.size() > 1;
    const int64_t M = static_cast<int64_t>(batch.size());
    logits.resize(static_cast<size_t>(M * c.vocab_size));
    decode_batch(m, batch.data(), tokens.data(), M, logits.data());
    for (int64_t i = 0; i < M; ++i)
      last[who[i]].assign(logits.begin() + i * c.vocab_size, logits.begin() + (i + 1) * c.vocab_size);
  }
  for (size_t s = 0; s < prompts.size(); ++s) EXPECT_EQ(together[s], alone[s]) << "sequence " << s;
  EXPECT_GT(distinct, 5);  // most steps really ran several sequences together
  EXPECT_NE(alone[0], alone[1]);
}
}  // namespace

// The backbone variants (q/k norm, q/k/v biases, llama3 rope scaling, head_dim apart): the cache
// and the batched decode step apply them as the full forward does.
TEST(Generate, KVCacheGreedyEqualsFullRecomputeWithVariants) {
  ModelConfig c = with_variants(small_config());
  Model m = make_model(c, 5);
  randomize_variant_params(m, 6);
  check_cache_equals_recompute(m);
  c = with_variants(on_moe(jtok_jtokm_config()));
  c.n_shared_experts = 0;
  c.norm_topk_prob = true;
  c.first_k_dense_replace = 0;
  c.mlp_only_layers = "1";
  Model moe = make_model(c, 7);
  randomize_variant_params(moe, 8);
  check_cache_equals_recompute(moe);
  expect_decode_batch_invariant(moe);
}

TEST(Generate, BatchedDecodeEqualsAlone) { check_batched_equals_alone(small_config()); }

// Each decode step's logits have the bits of the sequence decoded alone, for every batch size: a
// greedy reply does not depend on which requests share the server's steps. Dense; JTok + JTok-M;
// MoE (router and experts, whose row counts depend on the batch's routing) with both.
TEST(Generate, DecodeStepIsBatchInvariant) {
  ModelConfig c = small_config();
  c.vocab_size = 211;  // the LM head's rows: not a multiple of the kernels' 4-row blocks
  expect_decode_batch_invariant(make_model(c, 3));
  c = jtok_jtokm_config();
  c.vocab_size = 211;
  expect_decode_batch_invariant(make_model(c, 4));
  c = on_moe(c);
  c.n_shared_experts = 1;
  expect_decode_batch_invariant(make_model(c, 5));
}

TEST(Generate, BatchedDecodeEqualsAloneJTokAndJTokMOnMoe) {
  check_batched_equals_alone(jtok_jtokm_config());
  check_batched_equals_alone(on_moe(jtok_jtokm_config()));
}

// Chunked prefill (the server's --prefill-chunk): a prompt prefilled in chunks of 1, 3, 7 tokens
// gives the one-shot prefill's logits and KV cache within 1e-4 relative (another attention kernel
// and summation order), and greedy decoding from it the same tokens. Dense, JTok + JTok-M, MoE.
TEST(Generate, ChunkedPrefillEqualsOneShot) {
  const ModelConfig base = small_config(), tok = jtok_jtokm_config(), moe = on_moe(tok);
  std::vector<int32_t> prompt;
  for (int j = 0; j < 17; ++j) prompt.push_back(static_cast<int32_t>((j * 37 + 11) % 97));
  prompt[9] = prompt[2];  // a repeated id inside a chunk
  for (const ModelConfig& c : {base, tok, moe}) {
    SCOPED_TRACE(c.jtokm ? (c.model_type == "jtok_moe" ? "moe" : "jtok") : "dense");
    Model m = make_model(c, 7);
    auto greedy = [&](KVCache& kv, std::vector<float> l) {
      std::mt19937_64 rng(0);
      std::vector<int32_t> out;
      for (int i = 0; i < 12; ++i) {
        out.push_back(sample_token(l, SamplingParams{0.0, 0, 1.0}, rng));
        l = decode_step(m, kv, out.back());
      }
      return out;
    };
    KVCache one;
    const std::vector<float> l1 = prefill(m, one, prompt, 40);
    const std::vector<int32_t> t1 = greedy(one, l1);
    for (int64_t chunk : {1, 3, 7, 17, 40}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      KVCache kc;
      const std::vector<float> lc = prefill_chunked(m, kc, prompt, 40, chunk);
      EXPECT_LT(rel_err(lc, l1), 1e-4);
      if (chunk >= 17) {
        EXPECT_EQ(lc, l1);  // one chunk: prefill itself
      }
      ASSERT_EQ(kc.len, 17);
      for (size_t l = 0; l < kc.k.size(); ++l) {
        std::vector<float> a(one.k[l].begin(), one.k[l].begin() + 17 * c.kv_dim()), b(kc.k[l].begin(), kc.k[l].begin() + 17 * c.kv_dim());
        EXPECT_LT(rel_err(b, a), 1e-4) << "layer " << l;
      }
      EXPECT_EQ(greedy(kc, lc), t1);
    }
  }
  Model m = make_model(base, 7);
  KVCache empty;
  EXPECT_THROW(prefill_chunk(m, empty, prompt.data(), 3), Error);  // nothing prefilled yet
  KVCache kv;
  prefill(m, kv, {1, 2}, 4);
  EXPECT_THROW(prefill_chunk(m, kv, prompt.data(), 3), Error);  // 2 + 3 > 4
  EXPECT_THROW(prefill_chunked(m, kv, prompt, 40, 0), Error);
}

// A bf16 KV cache (half the bytes a step reads): teacher-forced along the f32 cache's greedy tokens,
// prompt prefilled in one shot and in chunks (both writers of the cache), the logits stay within a
// stated bound of the f32 cache's: a stored key or value is off by <= 2^-9 relative, so a score
// q.k by ~2^-9 |q||k|; this random network (init std 0.2) amplifies every error (see
// test_lowp_model): measured 1.3-1.4e-2 relative on the logits, bound 3e-2; no greedy pick flips in
// 20 steps (measured none; a flip needs a top-2 margin below twice that error).
TEST(Generate, Bf16KVCacheStaysCloseToF32) {
  ModelConfig c = small_config();
  c.jtok = true;
  c.jtok_layers = "0,2";
  Model m = make_model(c, 9);
  std::vector<int32_t> prompt;
  for (int j = 0; j < 11; ++j) prompt.push_back(static_cast<int32_t>((j * 41 + 5) % 97));
  for (int64_t chunk : {11, 4}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    KVCache f, b;
    b.bf16 = true;
    std::vector<float> lf = prefill_chunked(m, f, prompt, 40, chunk), lb = prefill_chunked(m, b, prompt, 40, chunk);
    ASSERT_TRUE(b.k.empty() && b.layers() == 3 && b.k16[0].size() == f.k[0].size());
    double worst = 0;
    int flips = 0;
    std::mt19937_64 rng(0);
    const SamplingParams greedy{0.0, 0, 1.0};
    for (int step = 0; step < 20; ++step) {
      const double e = rel_err(lb, lf);
      worst = std::max(worst, e);
      const int32_t next = sample_token(lf, greedy, rng);
      flips += sample_token(lb, greedy, rng) != next;
      lf = decode_step(m, f, next);
      lb = decode_step(m, b, next);
    }
    std::printf("bf16 KV cache (chunk %ld): logits within %.2e of the f32 cache's, %d greedy flips of 20\n",
                static_cast<long>(chunk), worst, flips);
    EXPECT_LT(worst, 3e-2);
    EXPECT_GT(worst, 1e-5);  // the cache really is bf16
    EXPECT_EQ(flips, 0);
  }
  EXPECT_EQ(parse_dtype("bf16", "--kv-dtype", kKvDtypes), Dtype::bf16);
  EXPECT_THROW(parse_dtype("f16", "--kv-dtype", kKvDtypes), Error);
  try {  // int8 is a dtype, but not one a KV cache holds
    parse_dtype("int8", "--kv-dtype", kKvDtypes);
    ADD_FAILURE() << "int8 KV cache accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--kv-dtype: dtype 'int8' is not one of f32, bf16");
  }
}

// generate_tokens (`jtok generate`'s loop): greedy, it samples what prefill + decode_step give, hands
// each token over as it comes, keeps a stop token without handing it over, and stops when the cache is full.
TEST(Generate, GenerateTokensStreamsUntilStopOrFullCache) {
  const Model m = make_model(jtok_jtokm_config(), 5);
  const std::vector<int32_t> prompt = {3, 14, 15};
  GenerateOptions opt;
  opt.max_new_tokens = 12;
  opt.sampling = SamplingParams{0.0, 0, 1.0};
  std::vector<int32_t> want;
  std::vector<double> margins;
  KVCache cache;
  std::vector<float> logits = prefill(m, cache, prompt, 40);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 12; ++i) {
    want.push_back(sample_token(logits, opt.sampling, rng));
    margins.push_back(top2_margin(logits));
    logits = decode_step(m, cache, want.back());
  }
  std::vector<int32_t> streamed;
  const auto stream = [&](int32_t t) { streamed.push_back(t); };
  GenerateResult r = generate_tokens(m, prompt, 40, opt, stream);
  EXPECT_EQ(r.generated, want);
  EXPECT_EQ(streamed, want);
  EXPECT_EQ(r.top2_margins, margins);
  // A stop token: the first that did not come before.
  size_t k = 1;
  while (k < want.size() && std::find(want.begin(), want.begin() + k, want[k]) != want.begin() + k) ++k;
  ASSERT_LT(k, want.size());
  opt.stop_ids = {want[k]};
  streamed.clear();
  r = generate_tokens(m, prompt, 40, opt, stream);
  EXPECT_EQ(r.generated, std::vector<int32_t>(want.begin(), want.begin() + k + 1));
  EXPECT_EQ(streamed, std::vector<int32_t>(want.begin(), want.begin() + k));
  // A cache of the prompt + 3 positions: 4 tokens (the last one sampled from the full cache).
  opt.stop_ids.clear();
  streamed.clear();
  r = generate_tokens(m, prompt, 6, opt, stream);
  EXPECT_EQ(r.generated, std::vector<int32_t>(want.begin(), want.begin() + 4));
  EXPECT_EQ(streamed, r.generated);
}

// prompt_logprobs: log p(prompt[t] | prompt[<t]) from one forward, one value per token after the first.
TEST(Generate, PromptLogprobsAreTheForwardsTokenLogprobs) {
  const Model m = make_model(small_config(), 5);
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65};
  const std::vector<float> lp = prompt_logprobs(m, prompt);
  ASSERT_EQ(lp.size(), prompt.size() - 1);
  Activations a;
  forward(m, a, prompt.data(), 1, 5);
  const int64_t Vp = m.cfg.padded_vocab(), V = m.cfg.vocab_size;
  for (int64_t t = 0; t + 1 < 5; ++t) {
    const float* row = a.logits.data() + t * Vp;
    double mx = row[0], sum = 0;
    for (int64_t v = 1; v < V; ++v) mx = std::max<double>(mx, row[v]);
    for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
    EXPECT_NEAR(lp[t], row[prompt[t + 1]] - mx - std::log(sum), 1e-4) << "position " << t;
  }
}
