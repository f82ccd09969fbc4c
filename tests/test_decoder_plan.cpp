// The GPU decoder's memory plan (src/cuda/decoder_sizes.h) by hand on two shapes: a tiny JTok +
// JTok-M model and configs/qwen3_0.6b.json with JTok-M n_e 5 on every layer, tables in hbm. CPU
// only: the plan is the arithmetic cuda/decoder_setup.cu and cuda/step_rows.cu allocate by.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "cuda/decoder_sizes.h"
#include "model/transformer.h"
#include "train/config.h"

using namespace jtok;
using namespace jtok::cuda;

namespace {

// configs/qwen3_0.6b.json's model (JTOK_ROOT: the source tree, as ctest sets it).
ModelConfig qwen3_0_6b() {
  const char* root = std::getenv("JTOK_ROOT");
  if (!root) throw std::runtime_error("JTOK_ROOT is not set (ctest sets it to the source tree)");
  return load_config(std::string(root) + "/configs/qwen3_0.6b.json").model;
}

int64_t param_count(const ModelConfig& c) {
  int64_t n = 0;
  for (const ParamInfo& p : param_layout(c)) n += p.numel;
  return n;
}

// Vp 1024, d 64, 2 layers, H 4 / KV 2 of hd 16, F 128, context 1024; JTok on both layers,
// JTok-M (n_e 3, top 2) on layer 1: 2 + 3 = 5 tables.
ModelConfig tiny() {
  ModelConfig m;
  m.vocab_size = 1000;
  m.vocab_pad_multiple = 64;
  m.hidden_size = 64;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.intermediate_size = 128;
  m.max_position_embeddings = 1024;
  m.jtok = true;
  m.jtokm = true;
  m.jtokm_layers = "1";
  m.jtokm_n_e = 3;
  m.jtokm_top_k = 2;
  return m;
}

DecoderSettings tiny_settings() {
  DecoderSettings s;  // bf16 weights and KV
  s.max_batch = 4;
  s.max_prefill = 8;  // R = 8 rows, head_rows = 8
  s.kv_tokens = 100;  // 7 pages of 16 (+ the scratch page)
  s.page_tokens = 16;
  s.table_rows = "hbm";
  return s;
}

}  // namespace

TEST(DecoderPlan, TinyByHand) {
  const ModelConfig c = tiny();
  const DecoderSettings s = tiny_settings();
  const DecoderLayerKinds k = decoder_layer_kinds(c);
  EXPECT_TRUE(k.dense && k.gated && !k.moe);
  EXPECT_EQ(k.jtokm_layers, 1);
  EXPECT_EQ(k.table_slots, 5);
  const DecoderMemoryPlan p = decoder_memory_plan(c, s);
  EXPECT_EQ(p.weights, 2 * param_count(c) + 2 * 4 * 1024 * 8);  // + RoPE cos, sin (T, hd/2) fp32
  // 2 layers x (K, V) x (7 + 1) pages of 16 x 2 x 16 bf16; page tables (16 + 1 sequences, 64 pages) int32.
  EXPECT_EQ(p.kv_pages, 2 * 2 * 8 * (16 * 2 * 16 * 2) + 4 * 17 * 64);
  // bf16: h a x (R,d), q att (R,qd), k v (R,kvd), q | k | v (R,qd+2kvd), gate | up (R,2F) act (R,F),
  // mlp_out nrows (R,d);
  // fp32: rstd, inv_norm (R), lse (H x max_prefill), m_logits m_sig (R,3), m_w (R,2), m_inv_norm (R);
  // int32: m_sel (R,2), step (3R), identity (R), counters (R,H).
  const int64_t R = 8, e = 3 * R * 64 + 2 * R * 64 + 2 * R * 32 + R * 128 + 3 * R * 128 + 2 * R * 64;
  const int64_t f32 = R + R + 4 * 8 + 2 * R * 3 + R * 2 + R;
  const int64_t i32 = R * 2 + 3 * R + R + R * 4;  // + paged attention's counters (R,H)
  EXPECT_EQ(p.activations, 2 * e + 4 * (f32 + i32));
  EXPECT_EQ(p.activations, 17184);
  EXPECT_EQ(p.attention_scratch, 4 * R * 4 * (1024 / 256) * (16 + 2));  // (R, H, chunks, hd + 2) fp32
  // (head_rows, Vp) fp32, lnf bf16; max_batch digests and their inputs (cuda/logit_digest.h).
  EXPECT_EQ(sizeof(LogitDigest) + sizeof(DigestRow), 552u + 16u);
  const int64_t digests = s.max_batch * (552 + 16);
  EXPECT_EQ(p.logits, 4 * 8 * 1024 + 2 * 8 * 64 + digests);
  // (5 slots, R, d) bf16; ids unique inverse order (R), offsets (R + 1), num_unique (1) int32.
  EXPECT_EQ(p.row_slots, 2 * 5 * R * 64 + 4 * (4 * R + R + 1 + 1));
  EXPECT_EQ(p.hbm_tables, 2 * 5 * 1024 * 64);
  // Pinned: step (3R), logits (head_rows, V), JTok-M choices (1 layer, max_batch, 2), ids (R).
  EXPECT_EQ(p.host_pinned, 4 * (3 * R + 8 * 1000 + 4 * 2 + R) + digests);
  EXPECT_EQ(p.total(), p.weights + p.kv_pages + p.activations + p.attention_scratch + p.logits + p.row_slots +
                           p.hbm_tables);
}

TEST(DecoderPlan, TinyVariants) {
  const ModelConfig c = tiny();
  DecoderSettings s = tiny_settings();
  const DecoderMemoryPlan hbm = decoder_memory_plan(c, s);
  s.table_rows = "staged";  // no device tables, the rows staged through pinned memory
  const DecoderMemoryPlan staged = decoder_memory_plan(c, s);
  EXPECT_EQ(staged.hbm_tables, 0);
  EXPECT_EQ(staged.host_pinned, hbm.host_pinned + 2 * 5 * 8 * 64);
  DecoderLayerKinds k = decoder_layer_kinds(c);
  k.gated = false;  // all-ones scalers (the set-up reads them): no mlp_out, nrows (R,d) bf16, inv_norm (R)
  EXPECT_EQ(decoder_memory_plan(c, s, k, false, true).activations, staged.activations - (2 * 2 * 8 * 64 + 4 * 8));
  DecoderCubBytes cub;
  cub.rows_dedup = 1000;  // what the GPU build adds: cub's scratch
  EXPECT_EQ(decoder_memory_plan(c, s, decoder_layer_kinds(c), false, true, cub).row_slots, staged.row_slots + 1000);
  s.bf16 = false;  // fp32 weights and activations, KV still bf16
  const DecoderMemoryPlan f32 = decoder_memory_plan(c, s);
  EXPECT_EQ(f32.weights, 4 * param_count(c) + 2 * 4 * 1024 * 8);
  EXPECT_EQ(f32.kv_pages, hbm.kv_pages);
  s.kv_bf16 = false;
  s.kv_tokens = 0;  // max_batch sequences of the whole context: 4 x 64 pages
  s.max_seqs = 2;
  EXPECT_EQ(decoder_memory_plan(c, s).kv_pages, 2 * 2 * (4 * 64 + 1) * (16 * 2 * 16 * 4) + 4 * 3 * 64);
  ModelConfig plain = c;
  plain.jtok = plain.jtokm = false;
  const DecoderMemoryPlan none = decoder_memory_plan(plain, tiny_settings());
  EXPECT_EQ(none.row_slots, 0);
  EXPECT_EQ(none.hbm_tables, 0);  // "hbm" asked, no tables to copy
}

TEST(DecoderPlan, Qwen3At4096ByHand) {
  ModelConfig c = qwen3_0_6b();
  // Vp 151936 (a multiple of 64), d 1024, 28 layers, H 16 / KV 8 of hd 128, F 3072, tied, q/k norm:
  // embed Vp d + per layer (q 1024x2048, k v 1024x1024, o 2048x1024, MLP 3 x 1024x3072, norms) + final norm.
  EXPECT_EQ(param_count(c), 151936 * 1024 + 28 * (6291456 + 9437184 + 2 * 128 + 2 * 1024) + 1024);
  EXPECT_EQ(param_count(c), 596049920);
  c.jtokm = true;
  c.jtokm_n_e = 5;  // on every layer: 140 tables of Vp x d
  c.jtokm_top_k = 2;
  DecoderSettings s;  // bf16, KV bf16, max_batch 16, pages of 16, kv_tokens 0: 16 x 256 pages
  s.max_prefill = 4096;
  s.table_rows = "hbm";
  const DecoderMemoryPlan p = decoder_memory_plan(c, s);
  const int64_t R = 4096, d = 1024, Vp = 151936;
  EXPECT_EQ(p.weights, 2 * param_count(c) + 2 * 4 * 4096 * 64);
  EXPECT_EQ(p.kv_pages, 2 * 28 * int64_t{4097} * (16 * 8 * 128 * 2) + 4 * 65 * 256);  // the scratch page included
  EXPECT_EQ(p.kv_pages, 7518094336);
  // h a x, q att, k v, the fused q | k | v rows, gate | up and act
  const int64_t e = 3 * R * d + 2 * R * 2048 + 2 * R * 1024 + R * (2048 + 2 * 1024) + 3 * R * 3072;
  const int64_t f32 = R + 16 * 4096 + 2 * R * 5 + R * 2 + R;
  const int64_t i32 = R * 2 + 3 * R + R + R * 16;  // + paged attention's counters (R,H)
  EXPECT_EQ(p.activations, 2 * e + 4 * (f32 + i32));
  // 16 chunks of 256 positions, 130 floats a head: 33,280 a row, so 256 MiB holds 2,016 of the 4,096 rows
  EXPECT_EQ(p.attention_scratch, int64_t{4} * 2016 * 16 * 16 * 130);
  EXPECT_EQ(p.attention_scratch, 268369920);
  EXPECT_EQ(p.logits, 4 * 32 * Vp + 2 * 32 * d + s.max_batch * (552 + 16));  // head_rows = 32; the digests
  EXPECT_EQ(p.row_slots, int64_t{2} * 140 * R * d + 4 * (5 * R + 2));
  EXPECT_EQ(p.hbm_tables, int64_t{2} * 140 * Vp * d);
  EXPECT_EQ(p.hbm_tables, 43563089920);  // 43.6 GB
  // The model's real context (40960) multiplies a row's scratch by 10: all 4,096 rows would take
  // ~5.45 GB; the decoder's holds the 201 rows 256 MiB holds, and never fewer than max_batch.
  EXPECT_EQ(4 * paged_attention_scratch(R, 16, 128, 40960), 5452595200);
  EXPECT_EQ(decoder_attention_scratch(R, 16, 16, 128, 40960), 201 * paged_attention_scratch(1, 16, 128, 40960));
  EXPECT_EQ(decoder_attention_scratch(R, 256, 16, 128, 40960), 256 * paged_attention_scratch(1, 16, 128, 40960));
  EXPECT_EQ(decoder_attention_scratch(8, 1, 16, 128, 40960), 8 * paged_attention_scratch(1, 16, 128, 40960));
  EXPECT_EQ(decoder_attention_scratch(R, 1, 4096, 128, 1 << 24), paged_attention_scratch(1, 4096, 128, 1 << 24));
}

// An int8 export's matrices as decode steps read them: per layer q | k | v (1024 -> 4096), o (2048 ->
// 1024), gate | up (1024 -> 6144), down (3072 -> 1024), and the tied head (Vp x 1024), a scale a row;
// counted only for an int8 export with int8_decode on. MoE layers' experts are not among them.
TEST(DecoderPlan, Int8MatricesByHand) {
  ModelConfig c = qwen3_0_6b();
  const int64_t d = 1024, Vp = 151936;
  const DecoderQ8Sizes z = decoder_q8_sizes(c);
  EXPECT_EQ(z.values, 28 * (4096 * d + d * 2048 + 6144 * d + d * 3072) + Vp * d);
  EXPECT_EQ(z.rows, 28 * (4096 + 1024 + 6144 + 1024) + Vp);
  EXPECT_EQ(z.bytes(), z.values + 4 * z.rows);
  EXPECT_EQ(z.values, param_count(c) - 28 * (2 * 1024 + 2 * 128) - 1024);  // all but the norms: every matrix
  DecoderSettings s;
  EXPECT_EQ(decoder_memory_plan(c, s).int8_weights, 0);
  const DecoderMemoryPlan p = decoder_memory_plan(c, s, true);
  EXPECT_EQ(p.int8_weights, z.bytes());
  EXPECT_EQ(p.total(), decoder_memory_plan(c, s).total() + z.bytes());
  EXPECT_NE(decoder_plan_line(p).find("int8 weights 0.56"), std::string::npos) << decoder_plan_line(p);
  // int8_only: every int8 matrix (the tied head is the embedding) leaves the bf16 copy, which keeps
  // the norms and RoPE's table; one layer's (the largest, dense: 13.1M values) come back in bf16 as
  // the prefills' scratch.
  EXPECT_EQ(z.max_layer_values, 4096 * d + d * 2048 + 6144 * d + d * 3072);
  EXPECT_EQ(decoder_q8_sizes(c, true).values, z.values);  // tied: no embedding matrix of its own
  s.int8_only = true;
  const DecoderMemoryPlan only = decoder_memory_plan(c, s, true);
  EXPECT_EQ(only.weights, p.weights - 2 * z.values);
  EXPECT_EQ(only.weights, 2 * (28 * (2 * 1024 + 2 * 128) + 1024) + 2 * 4 * c.max_position_embeddings * 64);
  EXPECT_EQ(only.int8_weights, z.bytes() + 2 * z.max_layer_values);
  EXPECT_EQ(only.total(), p.total() - 2 * z.values + 2 * z.max_layer_values);
  EXPECT_NE(decoder_plan_line(only).find("weights 0.00,"), std::string::npos) << decoder_plan_line(only);
  EXPECT_NE(decoder_plan_line(only).find("int8 weights 0.59"), std::string::npos) << decoder_plan_line(only);
  // Refused on a GPU of 0.5 GiB: each item names its way down (the int8 item both of --int8-decode's).
  const std::string why = decoder_memory_refusal(p, int64_t{1} << 29);
  EXPECT_NE(why.find("--int8-decode only drops the copy of its int8 matrices"), std::string::npos) << why;
  EXPECT_NE(why.find("--int8-decode off decodes from the bf16 copy alone; --int8-decode only"), std::string::npos)
      << why;
  ModelConfig untied = c;  // the embedding's int8 matrix comes to the device too: its rows are gathered
  untied.tie_word_embeddings = false;
  const DecoderQ8Sizes zu = decoder_q8_sizes(untied), zu_only = decoder_q8_sizes(untied, true);
  EXPECT_EQ(zu.values, z.values);  // decode steps read the head, never the whole embedding
  EXPECT_EQ(zu_only.values, z.values + Vp * d);
  EXPECT_EQ(zu_only.rows, z.rows + Vp);
  s.int8_only = false;
  const DecoderMemoryPlan untied_on = decoder_memory_plan(untied, s, true);
  EXPECT_EQ(untied_on.int8_weights, zu.bytes());
  s.int8_only = true;
  const DecoderMemoryPlan untied_only = decoder_memory_plan(untied, s, true);
  EXPECT_EQ(untied_only.weights, untied_on.weights - 2 * (z.values + Vp * d));
  EXPECT_EQ(untied_only.int8_weights, zu_only.bytes() + 2 * z.max_layer_values);
  s.int8_only = false;
  s.int8_decode = false;
  EXPECT_EQ(decoder_memory_plan(c, s, true).int8_weights, 0);
  c.model_type = "jtok_moe";  // layers 1..27 MoE: 8 routed experts of F 768 and a shared one
  c.n_routed_experts = 8, c.moe_intermediate_size = 768, c.n_shared_experts = 1, c.num_experts_per_tok = 2;
  ASSERT_TRUE(c.moe_on_layer(1) && !c.moe_on_layer(0));
  const DecoderQ8Sizes m = decoder_q8_sizes(c);
  const int64_t moe_values = 8 * 3 * 768 * d + 3 * 768 * d, moe_rows = 8 * (2 * 768 + d) + 2 * 768 + d;
  EXPECT_EQ(m.values, 28 * (4096 * d + d * 2048) + (6144 * d + d * 3072) + 27 * moe_values + Vp * d);
  EXPECT_EQ(m.rows, 28 * (4096 + 1024) + (6144 + 1024) + 27 * moe_rows + Vp);
  EXPECT_EQ(m.routed_values, 27 * 8 * 3 * 768 * d);  // what a decode step reads of them: the chosen
  EXPECT_EQ(m.routed_rows, 27 * 8 * (2 * 768 + d));
  // every matrix but the norms and the routers (fp32, the copy's)
  EXPECT_EQ(m.values, param_count(c) - 28 * (2 * 1024 + 2 * 128) - 1024 - 27 * 8 * d);
}

TEST(DecoderPlan, RefusalNamesTheLargestItems) {
  ModelConfig c = qwen3_0_6b();
  c.jtokm = true;
  c.jtokm_n_e = 5;
  DecoderSettings s;
  s.max_prefill = 4096;
  s.table_rows = "hbm";
  const DecoderMemoryPlan p = decoder_memory_plan(c, s);
  const int64_t gib = int64_t{1} << 30;
  EXPECT_EQ(decoder_memory_refusal(p, 80 * gib), "");
  const std::string why = decoder_memory_refusal(p, 40 * gib);
  EXPECT_NE(why.find("needs 50."), std::string::npos) << why;
  EXPECT_NE(why.find("40.00 GiB free"), std::string::npos) << why;
  const size_t hbm = why.find("hbm tables 40.57 GiB (--table-rows in_place"), kv = why.find("KV pages 7.00 GiB");
  EXPECT_NE(hbm, std::string::npos) << why;
  EXPECT_NE(kv, std::string::npos) << why;
  EXPECT_LT(hbm, kv);  // the largest first
  EXPECT_NE(why.find("--kv-budget-tokens"), std::string::npos) << why;
  EXPECT_NE(why.find("weights 1.11 GiB (--precision bf16"), std::string::npos) << why;  // the third
  EXPECT_EQ(why.find("table row slots 1.09 GiB ("), std::string::npos) << why;  // the fourth: only in the plan line
  // Just over: the headroom counts.
  EXPECT_NE(decoder_memory_refusal(p, p.total() + kDecoderHeadroomBytes - 1), "");
  EXPECT_EQ(decoder_memory_refusal(p, p.total() + kDecoderHeadroomBytes), "");
  const std::string line = decoder_plan_line(p);
  EXPECT_EQ(line.rfind("GPU memory plan 50.", 0), 0u) << line;
  EXPECT_NE(line.find("hbm tables 40.57"), std::string::npos) << line;
}
