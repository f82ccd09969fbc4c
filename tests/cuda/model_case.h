// The whole-model tests' shared parts (tests/cuda/test_cuda_model.cpp, test_cuda_model_steps.cpp,
// the decoder tests): the small model configs, their test weights and batches, the decoder tests'
// settings, and the comparisons by normalised error ||gpu - cpu|| / ||cpu|| (each prints
// `cuda model NAME err E (tol T)`).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/decoder.h"
#include "cuda/model.h"
#include "cuda_case.h"
#include "model/transformer.h"

namespace jtok::cuda_test {

// d 256, 2 layers, 4 heads / 2 kv heads (hd 64), vocab 250 padded to 256.
inline jtok::ModelConfig tiny_dense() {
  jtok::ModelConfig c;
  c.vocab_size = 250;
  c.hidden_size = 256;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 320;
  c.max_position_embeddings = 64;
  return c;
}

// Qwen3's shape: head_dim set apart from d (q_dim 256 != d 128), qk_norm, tied embeddings.
inline jtok::ModelConfig tiny_qwen3() {
  jtok::ModelConfig c = tiny_dense();
  c.hidden_size = 128;
  c.head_dim = 64;
  c.qk_norm = true;
  c.tie_word_embeddings = true;
  c.rope_theta = 1000000.0;
  return c;
}

// Qwen2's: q / k / v biases.
inline jtok::ModelConfig tiny_qwen2() {
  jtok::ModelConfig c = tiny_dense();
  c.attention_bias = true;
  return c;
}

// Llama 3.1's: RoPE with its frequency-dependent scaling (an original context of 16 positions, so
// the tiny context's wavelengths fall on every side of the scaling's bands), theta 500000, untied
// head, GQA.
inline jtok::ModelConfig tiny_llama3() {
  jtok::ModelConfig c = tiny_dense();
  c.rope_theta = 500000.0;
  c.rope_scaling_type = std::string("llama3");
  c.rope_scaling_original_max_position_embeddings = 16;
  return c;
}

// JTok on layer 1 (layer 0 plain): the gate on the MLP update, its scaler and table gradients.
inline jtok::ModelConfig tiny_jtok() {
  jtok::ModelConfig c = tiny_dense();
  c.jtok = true;
  c.jtok_layers = std::string("1");  // (a literal assigned here trips GCC 12's -Wrestrict false positive)
  return c;
}

// JTok-M on every layer (3 tables a layer, top 2), and the same beside JTok on layer 1.
inline jtok::ModelConfig tiny_jtokm() {
  jtok::ModelConfig c = tiny_dense();
  c.jtokm = true;
  c.jtokm_n_e = 3;
  c.jtokm_top_k = 2;
  c.jtokm_aux_loss_coef = 1e-2;  // large enough that its gradient shows in the router's
  return c;
}
inline jtok::ModelConfig tiny_jtok_jtokm() {
  jtok::ModelConfig c = tiny_jtokm();
  c.jtok = true;
  c.jtok_layers = std::string("1");
  return c;
}
// For the bf16 runs against the fp32 CPU: top-K = n_e, so every position routes to every table. The
// bf16 router logits differ from the CPU's by some tenths of a percent of their spread (by estimate:
// bf16 inputs through one or two layers), enough to flip a near-tie at the K-th place somewhere in
// 2 x 66 positions now and then, and a flipped choice moves that row's
// gradient (and touched flag) to another table: a test failure that is no kernel's fault. The
// top-K choice itself is dtype-free (fp32 logits, the same routing kernel), checked in fp32 above
// and in CudaOps.Jtokm; the weights still depend on every logit, so the router's gradient is live.
inline jtok::ModelConfig every_table_routed(jtok::ModelConfig c) {
  c.jtokm_top_k = c.jtokm_n_e;
  return c;
}

// MoE (DeepSeekMoE-style, model/moe.h): layer 0 dense, layer 1 the top 2 of 4 routed experts; then
// a shared expert beside them on every layer with the top-2 weights renormalised; and the latter
// with JTok-M on every layer and JTok on layer 1 (the MoE output gated). The aux loss coefficient is
// large enough that its gradient shows in the routers'.
inline jtok::ModelConfig tiny_moe() {
  jtok::ModelConfig c = tiny_dense();
  c.model_type = "jtok_moe";
  c.first_k_dense_replace = 1;
  c.n_routed_experts = 4;
  c.n_shared_experts = 0;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 96;
  c.router_aux_loss_coef = 1e-2;
  return c;
}
inline jtok::ModelConfig tiny_moe_shared() {
  jtok::ModelConfig c = tiny_moe();
  c.first_k_dense_replace = 0;
  c.n_shared_experts = 1;
  c.norm_topk_prob = true;
  return c;
}
inline jtok::ModelConfig tiny_moe_jtok_jtokm() {
  jtok::ModelConfig c = tiny_moe_shared();
  c.jtokm = true;
  c.jtokm_n_e = 3;
  c.jtokm_top_k = 2;
  c.jtokm_aux_loss_coef = 1e-2;
  c.jtok = true;
  c.jtok_layers = std::string("1");
  return c;
}
// The MoE bench's attention shape (configs/bench_moe.json: d 128 over 4 heads / 2 kv heads, hd 32,
// the GPU attention's smallest): dense, and MoE with a shared expert beside JTok-M on every layer.
inline jtok::ModelConfig tiny_hd32() {
  jtok::ModelConfig c = tiny_dense();
  c.hidden_size = 128;
  return c;
}
inline jtok::ModelConfig tiny_hd32_moe_jtokm() {
  jtok::ModelConfig c = tiny_moe_shared();
  c.hidden_size = 128;
  c.jtokm = true;
  c.jtokm_n_e = 3;
  c.jtokm_top_k = 2;
  c.jtokm_aux_loss_coef = 1e-2;
  return c;
}
// For bf16: every token takes all 4 experts (top 4 of 4), so no top-K choice can flip on a
// near-tie between bf16 and the fp32 CPU (a flipped token moves a row between experts: an O(1)
// change in their gradients that no tolerance would tell from a bug); the choice itself is checked
// in fp32.
inline jtok::ModelConfig tiny_moe_all_experts() {
  jtok::ModelConfig c = tiny_moe_shared();
  c.num_experts_per_tok = 4;
  c.norm_topk_prob = false;
  return c;
}

// make_model's weights with every 1-D tensor (gains 1, biases 0 at init) moved off its constant, so
// the gains and biases take part in the forward.
inline jtok::Model test_model(const jtok::ModelConfig& c) {
  jtok::Model m = jtok::make_model(c, 7);
  uint64_t seed = 100;
  for (const auto& p : m.layout) {
    if (p.shape.size() != 1) continue;
    const auto noise = jtok::testing::randn(static_cast<size_t>(p.numel), seed++, 0.2f);
    for (int64_t i = 0; i < p.numel; ++i) m.params[static_cast<size_t>(p.offset + i)] += noise[static_cast<size_t>(i)];
  }
  return m;
}

// The decoder tests' small GPU decoder (test_cuda_decoder*.cpp, test_cuda_logit_digest.cpp): weights,
// activations and KV pages all bf16 or all fp32, up to 4 sequences a decode step, 40 tokens a prefill
// call, pages of 16 positions, the token-table rows from `rows`; a test sets on top what it varies.
inline jtok::cuda::DecoderSettings decoder_settings(bool bf16, const std::string& rows = "auto") {
  jtok::cuda::DecoderSettings s;
  s.bf16 = bf16;
  s.kv_bf16 = bf16;
  s.max_batch = 4;
  s.max_prefill = 40;
  s.page_tokens = 16;
  s.table_rows = rows;
  return s;
}

struct Batch {
  int64_t B = 2, T = 33;
  std::vector<int32_t> ids, targets;
};
inline Batch make_batch(const jtok::ModelConfig& c, uint64_t seed) {
  Batch b;
  b.ids = skewed_ids(b.B * b.T, c.vocab_size, seed);  // repeated ids: the embedding's row sums
  // And one hot id (more than kHotChunk of the 66 positions: cuda/hot_ids.cuh's pieces, in every
  // table's backward and the embedding's).
  for (size_t n = 0; n < b.ids.size(); n += 2) b.ids[n] = 3;
  b.targets = skewed_ids(b.B * b.T, c.vocab_size, seed + 1);
  return b;
}

inline void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want, double tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i;
  const double err = jtok::testing::rel_err(got, want);
  std::printf("cuda model %-52s err %.3e (tol %.1e)\n", what.c_str(), err, tol);
  EXPECT_LE(err, tol) << what;
}

// Every parameter tensor of the flat layout, by name.
inline void expect_tensors_close(const std::string& what, const jtok::Model& m, const std::vector<float>& got,
                          const float* want, double tol) {
  for (const auto& p : m.layout) {
    const auto lo = static_cast<size_t>(p.offset), hi = static_cast<size_t>(p.offset + p.numel);
    expect_close(what + " " + p.name, std::vector<float>(got.begin() + lo, got.begin() + hi),
                 std::vector<float>(want + lo, want + hi), tol);
  }
}

// Every token table's gradient (the CPU's row-sparse one made dense), and the rows flagged touched:
// exactly those with a CPU gradient row.
template <typename E>
inline void expect_table_grads_close(const std::string& name, const jtok::Model& m, const jtok::cuda::DeviceModel<E>& dm,
                              double tol) {
  const int64_t Vp = m.cfg.padded_vocab();
  for (size_t k = 0; k < m.tables.size(); ++k) {
    expect_close(name + " table grad " + m.table_names[k], jtok::cuda::download_table_grad(dm, static_cast<int64_t>(k)),
                 jtok::densify(m.table_grads[k], Vp), tol);
    const std::vector<uint8_t> touched = jtok::cuda::download_table_touched(dm, static_cast<int64_t>(k));
    for (int64_t r = 0; r < Vp; ++r)
      ASSERT_EQ(touched[static_cast<size_t>(r)] != 0, m.table_grads[k].slot[static_cast<size_t>(r)] >= 0)
          << m.table_names[k] << " row " << r;
  }
}

// The CPU engine's step on m: the loss; m.grads, acts.lnf hold the rest.
inline double cpu_step(jtok::Model& m, jtok::Activations& acts, const Batch& b) {
  jtok::zero_grads(m);
  jtok::forward(m, acts, b.ids.data(), b.B, b.T);
  return jtok::backward(m, acts, b.ids.data(), b.targets.data());
}

}  // namespace jtok::cuda_test
