// The GPU decoder (src/cuda/decoder.h) against the CPU engine's KV-cache decode (infer/generate.h)
// on the same weights: prefill logits (the last position's and every position's), greedy decode
// steps of three sequences at different lengths together (tokens, logits, token-table rows read),
// a prefill in two chunks against one, a fork's continuation, a sequence opened from stored prefix
// blocks (shared pages) and their page accounting, the table rows' three paths, an export's bf16 /
// int8 matrices (dequantised at load), bf16's top-1 agreement, and the refusals. Runs only on a GPU host (in
// test_cuda_ops).
//
// Tolerances: fp32 (weights, activations and KV pages in fp32) sums in other orders than the CPU
// (cuBLASLt tiles, the flash / paged attention's chunked softmax, per-block norms): logits within
// 2e-5 normalised error of the CPU's, the same greedy tokens and rows read. bf16 (weights,
// activations and KV pages in bf16) against the fp32 CPU: logits within 5e-2, and the top-1 token
// the CPU's on at least 3 of 4 predictions (teacher-forced on the CPU's tokens), a disagreement only
// where the CPU's own top two are within 5% of its logit range (a near tie of random weights).
// Same-device comparisons (chunks, forks, row paths) are bitwise where the products have the same
// shapes (fork; the three row paths), else within the fp32 tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/decoder.h"
#include "decoder_runs.h"
#include "error_test_util.h"
#include "infer/generate.h"
#include "model/lowp_weights.h"
#include "model/transformer.h"
#include "model/weights_io.h"
#include "model_case.h"
#include "ops/lowp_convert.h"

namespace {

using namespace jtok::cuda_test;
using jtok::cuda::DecoderSettings;
using jtok::cuda::DeviceDecoder;

constexpr int kSteps = 8;

// Three prompts: within a page, across one page boundary, across two (page_tokens 16).
std::vector<std::vector<int32_t>> prompts(const jtok::ModelConfig& c) {
  return {skewed_ids(5, c.vocab_size, 31), skewed_ids(17, c.vocab_size, 32), skewed_ids(33, c.vocab_size, 33)};
}

// fp32: every logit close, the same greedy tokens and rows read at every step; the GPU decodes
// on_gpu, the CPU ref (the same weights unless a test says otherwise).
void expect_decode_matches(const std::string& name, const jtok::Model& ref, const jtok::Model& on_gpu) {
  const jtok::ModelConfig& c = ref.cfg;
  const auto ps = prompts(c);
  const Run cpu = cpu_run(ref, ps, kSteps);
  auto dec = jtok::cuda::make_device_decoder(on_gpu, decoder_settings(false));
  std::printf("%s\n", dec->describe().c_str());
  const Run gpu = gpu_run(*dec, c, ps, kSteps);
  for (size_t i = 0; i < ps.size(); ++i)
    expect_close(name + " prefill " + std::to_string(i), gpu.prefill[i], cpu.prefill[i], 2e-5);
  for (int s = 0; s < kSteps; ++s) {
    const std::string at = name + " step " + std::to_string(s);
    ASSERT_EQ(gpu.fed[static_cast<size_t>(s)], cpu.fed[static_cast<size_t>(s)]) << at << ": greedy tokens differ";
    expect_close(at, gpu.logits[static_cast<size_t>(s)], cpu.logits[static_cast<size_t>(s)], 2e-5);
    EXPECT_EQ(gpu.rows[static_cast<size_t>(s)], cpu.rows[static_cast<size_t>(s)]) << at << ": table rows read";
  }
}

void expect_decode_matches(const std::string& name, const jtok::ModelConfig& c) {
  const jtok::Model m = test_model(c);
  expect_decode_matches(name, m, m);
}

TEST(CudaDecoder, DenseMatchesCpu) { expect_decode_matches("decoder dense fp32", tiny_dense()); }
TEST(CudaDecoder, JtokMatchesCpu) { expect_decode_matches("decoder jtok fp32", tiny_jtok()); }
TEST(CudaDecoder, JtokmMatchesCpu) { expect_decode_matches("decoder jtokm fp32", tiny_jtokm()); }
TEST(CudaDecoder, JtokAndJtokmMatchesCpu) { expect_decode_matches("decoder jtok+jtokm fp32", tiny_jtok_jtokm()); }
TEST(CudaDecoder, MoeJtokJtokmMatchesCpu) { expect_decode_matches("decoder moe+jtok+jtokm fp32", tiny_moe_jtok_jtokm()); }
TEST(CudaDecoder, HeadDim32MoeJtokmMatchesCpu) {
  expect_decode_matches("decoder hd32 moe+jtokm fp32", tiny_hd32_moe_jtokm());
}
TEST(CudaDecoder, Qwen3MatchesCpu) {
  ASSERT_TRUE(tiny_qwen3().qk_norm && tiny_qwen3().tie_word_embeddings);
  expect_decode_matches("decoder qwen3 fp32", tiny_qwen3());
}
TEST(CudaDecoder, Llama3MatchesCpu) {
  jtok::ModelConfig plain = tiny_llama3();
  plain.rope_scaling_type = "none";
  ASSERT_NE(jtok::make_model_rope_table(tiny_llama3()).cos, jtok::make_model_rope_table(plain).cos) << "no scaling";
  expect_decode_matches("decoder llama3 fp32", tiny_llama3());
}
TEST(CudaDecoder, Qwen2BiasMatchesCpu) { expect_decode_matches("decoder qwen2 fp32", tiny_qwen2()); }

// Every position's logits of a prefill (the `each` blocks of 32 rows: 32 + 5) against the CPU
// prefill's, and the last one's: the same bits as the last block's row; then the same prompt in two
// chunks (20 + 17: the second's positions from 20).
TEST(CudaDecoder, PrefillEachPositionMatchesCpu) {
  const jtok::ModelConfig c = tiny_jtok_jtokm();
  const jtok::Model m = test_model(c);
  const std::vector<int32_t> p = skewed_ids(37, c.vocab_size, 41);
  const int64_t V = c.vocab_size, n = static_cast<int64_t>(p.size());
  std::vector<float> cpu_each(static_cast<size_t>(n * V));
  jtok::KVCache cache;
  jtok::prefill(m, cache, p, kContext, [&](int64_t pos, int64_t k, const float* l) {
    std::copy(l, l + k * V, cpu_each.begin() + pos * V);
  });
  auto dec = jtok::cuda::make_device_decoder(m, decoder_settings(false));
  for (int64_t first : {n, int64_t{20}}) {
    const std::string what = "decoder prefill each position (" + std::to_string(first) + " + rest)";
    std::vector<float> gpu_each(cpu_each.size(), -1.0f), last(static_cast<size_t>(V));
    const auto each = [&](int64_t pos, int64_t b, const float* l) {
      ASSERT_LE(b, 32) << what;
      std::copy(l, l + b * V, gpu_each.begin() + pos * V);
    };
    const int64_t seq = dec->open(kContext);
    dec->prefill(seq, p.data(), first, last.data(), each);
    if (first < n) dec->prefill(seq, p.data() + first, n - first, last.data(), each);
    expect_close(what, gpu_each, cpu_each, 2e-5);
    EXPECT_EQ(0, std::memcmp(last.data(), gpu_each.data() + (n - 1) * V, static_cast<size_t>(V) * sizeof(float)))
        << what;
    dec->close(seq);
  }
}

// A prompt in two chunks (the first fresh, the second over the pages) against one prefill, and a
// decode step after each.
TEST(CudaDecoder, TwoChunkPrefillMatchesOne) {
  const jtok::ModelConfig c = tiny_moe_jtok_jtokm();
  const jtok::Model m = test_model(c);
  const std::vector<int32_t> p = skewed_ids(33, c.vocab_size, 51);
  const int64_t V = c.vocab_size;
  auto dec = jtok::cuda::make_device_decoder(m, decoder_settings(false));
  std::vector<float> one(static_cast<size_t>(V)), two(one.size()), step1(one.size()), step2(one.size());
  const int64_t a = dec->open(kContext), b = dec->open(kContext);
  dec->prefill(a, p.data(), 33, one.data());
  dec->prefill(b, p.data(), 20, two.data());
  dec->prefill(b, p.data() + 20, 13, two.data());
  EXPECT_EQ(dec->length(b), 33);
  expect_close("decoder prefill 20 + 13 vs 33", two, one, 2e-5);
  const int32_t t = argmax(one.data(), V);
  dec->decode(&a, &t, 1, step1.data());
  dec->decode(&b, &t, 1, step2.data());
  expect_close("decoder decode after 20 + 13 vs 33", step2, step1, 2e-5);
}

// A fork continues as its parent would: a decode of each alone gives the same bits; after the parent
// is closed and its pages rewritten by another sequence, the fork still continues as a sequence
// that never forked.
TEST(CudaDecoder, ForkContinuesIdentically) {
  const jtok::ModelConfig c = tiny_jtok_jtokm();
  const jtok::Model m = test_model(c);
  const std::vector<int32_t> p = skewed_ids(33, c.vocab_size, 61), other = skewed_ids(40, c.vocab_size, 62);
  const int64_t V = c.vocab_size;
  auto dec = jtok::cuda::make_device_decoder(m, decoder_settings(false));
  std::vector<float> la(static_cast<size_t>(V)), lb(la.size()), ld(la.size());
  const int64_t a = dec->open(kContext);
  dec->prefill(a, p.data(), 33, la.data());
  const int64_t b = dec->fork(a, kContext);
  EXPECT_EQ(dec->length(b), 33);
  const int32_t t1 = argmax(la.data(), V);
  dec->decode(&a, &t1, 1, la.data());
  dec->decode(&b, &t1, 1, lb.data());
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float))) << "fork's first step";
  dec->close(a);
  const int64_t o = dec->open(kContext);  // takes the parent's pages back from the pool
  dec->prefill(o, other.data(), 40, la.data());
  const int32_t t2 = argmax(lb.data(), V);
  dec->decode(&b, &t2, 1, lb.data());
  const int64_t d = dec->open(kContext);  // the same history, never forked
  dec->prefill(d, p.data(), 33, ld.data());
  dec->decode(&d, &t1, 1, ld.data());
  dec->decode(&d, &t2, 1, ld.data());
  EXPECT_EQ(0, std::memcmp(ld.data(), lb.data(), ld.size() * sizeof(float))) << "fork after its parent closed";
}

// Prefix blocks as shared pages: a sequence opened from two blocks kept from another gives, piece
// and step, the bits of that sequence prefilled in the same pieces (the same kernels at the same
// positions over the same page contents), in fp32 and bf16; so does its fork. The blocks' pages are
// counted once (keeping costs no page; opening from them only the pages past them), survive their
// sequence's close and a stranger reusing its other pages, and come back when the last holder goes.
TEST(CudaDecoder, SequenceFromStoredBlocksGivesThePiecewiseBits) {
  const jtok::ModelConfig c = tiny_jtok_jtokm();
  const jtok::Model m = test_model(c);
  const std::vector<int32_t> p = skewed_ids(45, c.vocab_size, 81), other = skewed_ids(60, c.vocab_size, 82);
  const int64_t V = c.vocab_size;
  for (bool bf16 : {false, true}) {
    const std::string where = bf16 ? "bf16" : "fp32";
    DecoderSettings s = decoder_settings(bf16);
    s.kv_tokens = 16 * 16;
    auto dec = jtok::cuda::make_device_decoder(m, s);
    ASSERT_EQ(dec->page_tokens(), 16);
    const int64_t total = dec->free_pages();
    ASSERT_EQ(total, 16);
    std::vector<float> la(static_cast<size_t>(V)), lb(la.size()), lf(la.size());
    const int64_t a = dec->open(kContext);  // 4 pages
    dec->prefill(a, p.data(), 16, la.data());
    dec->prefill(a, p.data() + 16, 16, la.data());
    const int64_t b0 = dec->keep_block(a, 0, 16), b1 = dec->keep_block(a, 16, 16);
    EXPECT_EQ(dec->free_pages(), total - 4) << where << ": a kept block costs no page";
    dec->prefill(a, p.data() + 32, 13, la.data());
    const int32_t t = argmax(la.data(), V);
    std::vector<float> la_step(la.size());
    dec->decode(&a, &t, 1, la_step.data());
    dec->close(a);
    EXPECT_EQ(dec->free_pages(), total - 2) << where << ": the blocks keep their 2 pages";
    const int64_t o = dec->open(kContext);  // a stranger takes a's other pages back and writes them
    dec->prefill(o, other.data(), 40, lf.data());
    const int64_t b = dec->open_from_blocks({b0, b1}, kContext);
    EXPECT_EQ(dec->length(b), 32) << where;
    EXPECT_EQ(dec->free_pages(), total - 2 - 4 - 2) << where << ": only the pages past the blocks are its own";
    dec->prefill(b, p.data() + 32, 13, lb.data());
    EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float))) << where << ": the last piece";
    const int64_t f = dec->fork(b, kContext);  // maps the blocks' pages, copies b's own
    EXPECT_EQ(dec->free_pages(), total - 2 - 4 - 2 - 2) << where;
    dec->decode(&b, &t, 1, lb.data());
    dec->decode(&f, &t, 1, lf.data());
    EXPECT_EQ(0, std::memcmp(la_step.data(), lb.data(), la.size() * sizeof(float))) << where << ": a step";
    EXPECT_EQ(0, std::memcmp(la_step.data(), lf.data(), la.size() * sizeof(float))) << where << ": its fork's step";
    dec->drop_block(b0);
    dec->drop_block(b1);
    EXPECT_EQ(dec->free_pages(), total - 2 - 4 - 2 - 2) << where << ": b and f still map them";
    dec->close(b);
    dec->close(o);
    EXPECT_EQ(dec->free_pages(), total - 4) << where;  // f: 2 shared pages and 2 of its own
    dec->close(f);
    EXPECT_EQ(dec->free_pages(), total) << where;
  }
}

// Blocks are whole pages of written positions; an unknown block is named.
TEST(CudaDecoder, StoredBlocksAreWholeWrittenPages) {
  const jtok::Model m = test_model(tiny_dense());
  auto dec = jtok::cuda::make_device_decoder(m, decoder_settings(false));
  const std::vector<int32_t> p = skewed_ids(20, m.cfg.vocab_size, 91);
  std::vector<float> logits(static_cast<size_t>(m.cfg.vocab_size));
  const int64_t a = dec->open(kContext);
  dec->prefill(a, p.data(), 20, logits.data());
  jtok::testing::expect_error([&] { dec->keep_block(a, 8, 16); }, {"whole pages of 16"});
  jtok::testing::expect_error([&] { dec->keep_block(a, 16, 16); }, {"20 written"});
  jtok::testing::expect_error([&] { dec->open_from_blocks({3}, kContext); }, {"block handle 3"});
  const int64_t b = dec->keep_block(a, 0, 16);
  jtok::testing::expect_error([&] { dec->open_from_blocks({b}, 8); }, {"capacity of 8"});
  dec->drop_block(b);
  jtok::testing::expect_error([&] { dec->drop_block(b); }, {"block handle"});
}

// An export's bf16 / int8 matrices (`jtok export --weight-dtype`) are dequantised at load: the fp32
// decoder decodes as the CPU's fp32 engine on the dequantised weights (not the CPU's own bf16 / int8
// kernels, which round their inputs too, differently by host). MoE + JTok + JTok-M: attention, dense
// and expert matrices, embedding and head.
TEST(CudaDecoder, LowpExportDecodesItsDequantisedWeights) {
  const jtok::ModelConfig c = tiny_moe_jtok_jtokm();
  const jtok::Model m = test_model(c);
  const std::string file = ::testing::TempDir() + "jtok_cuda_lowp_decoder.safetensors";
  for (auto t : {jtok::Dtype::bf16, jtok::Dtype::int8}) {
    jtok::StFile st = jtok::weights_to_st(m);
    jtok::convert_to_lowp(st, c, t);
    jtok::write_safetensors(file, st);
    jtok::Model q = jtok::make_model(c, 0, jtok::ModelAlloc{.init = false, .grads = false});
    jtok::load_weights(q, jtok::read_safetensors_index(file));
    ASSERT_EQ(q.lowp.dtype, t);
    jtok::Model ref = test_model(c);  // m's weights with the matrices as q holds them
    jtok::params_block_f32(q, jtok::lowp_slots(q), ref.params.data(), 0, static_cast<int64_t>(ref.params.size()));
    ASSERT_FALSE(std::equal(ref.params.begin(), ref.params.end(), m.params.begin())) << "the export rounded nothing";
    expect_decode_matches(std::string("decoder from a ") + jtok::dtype_name(t) + " export, fp32", ref, q);
    const std::string said = jtok::cuda::make_device_decoder(q, decoder_settings(true))->describe();
    EXPECT_NE(said.find(std::string("bf16 weights (the checkpoint's ") + jtok::dtype_name(t)), std::string::npos)
        << said;
  }
  std::remove(file.c_str());
}

// bf16 weights, activations and KV pages against the fp32 CPU, fed the CPU's greedy tokens: logits
// close, top-1 the CPU's on at least 3 of 4 predictions, a disagreement only at a near tie.
void expect_bf16_near_cpu(const std::string& name, const jtok::ModelConfig& c) {
  const jtok::Model m = test_model(c);
  const auto ps = prompts(c);
  const int64_t V = c.vocab_size;
  const Run cpu = cpu_run(m, ps, kSteps);
  auto dec = jtok::cuda::make_device_decoder(m, decoder_settings(true));
  std::printf("%s\n", dec->describe().c_str());
  const Run gpu = gpu_run(*dec, c, ps, kSteps, &cpu);
  std::vector<float> got = concat(gpu.prefill), want = concat(cpu.prefill);
  for (int s = 0; s < kSteps; ++s) {
    got.insert(got.end(), gpu.logits[static_cast<size_t>(s)].begin(), gpu.logits[static_cast<size_t>(s)].end());
    want.insert(want.end(), cpu.logits[static_cast<size_t>(s)].begin(), cpu.logits[static_cast<size_t>(s)].end());
  }
  expect_close(name + " logits", got, want, 5e-2);
  int64_t agree = 0;
  const int64_t rows = static_cast<int64_t>(want.size()) / V;
  for (int64_t r = 0; r < rows; ++r) {
    const float* w = want.data() + r * V;
    const int32_t g = argmax(got.data() + r * V, V), best = argmax(w, V);
    const float range = w[best] - *std::min_element(w, w + V);
    agree += g == best;
    EXPECT_LE(w[best] - w[g], 0.05f * range) << name << " row " << r << ": top-1 " << g << ", the CPU's " << best;
  }
  std::printf("cuda decoder %s top-1 agreement %lld / %lld\n", name.c_str(), static_cast<long long>(agree),
              static_cast<long long>(rows));
  EXPECT_GE(4 * agree, 3 * rows) << name;
}

TEST(CudaDecoder, Bf16NearCpu) {
  expect_bf16_near_cpu("dense bf16", tiny_dense());
  expect_bf16_near_cpu("qwen3 bf16", tiny_qwen3());
  expect_bf16_near_cpu("jtok+jtokm bf16", every_table_routed(tiny_jtok_jtokm()));
  expect_bf16_near_cpu("moe all experts bf16", tiny_moe_all_experts());
}

// m's token tables stored as bf16 (rounded to nearest even): the in-place path's bf16 rows.
void tables_to_bf16(jtok::Model& m) {
  for (jtok::TokenTable& t : m.tables) {
    std::vector<uint16_t> bits(static_cast<size_t>(t.numel()));
    jtok::quantize_bf16(bits.data(), t.data(), t.numel());
    std::vector<uint8_t> bytes(bits.size() * 2);
    std::memcpy(bytes.data(), bits.data(), bytes.size());
    t = jtok::TokenTable::quantized_in_ram(t.rows, t.dim, jtok::Dtype::bf16, std::move(bytes), {});
  }
}

// The table rows from a device copy, in place and staged: the same logits' bits and rows read.
void expect_row_paths_agree(const std::string& name, const jtok::Model& m, bool bf16) {
  const auto ps = prompts(m.cfg);
  std::vector<Run> runs;
  for (const char* path : {"hbm", "in_place", "staged"}) {
    auto dec = jtok::cuda::make_device_decoder(m, decoder_settings(bf16, path));
    EXPECT_NE(dec->describe().find(std::string("table rows ") + path), std::string::npos) << dec->describe();
    runs.push_back(gpu_run(*dec, m.cfg, ps, 4));
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    EXPECT_EQ(concat(runs[r].prefill), concat(runs[0].prefill)) << name << " path " << r << " prefill";
    EXPECT_EQ(concat(runs[r].logits), concat(runs[0].logits)) << name << " path " << r << " decode";
    EXPECT_EQ(runs[r].fed, runs[0].fed) << name << " path " << r;
    EXPECT_EQ(runs[r].rows, runs[0].rows) << name << " path " << r;
  }
}

TEST(CudaDecoder, TableRowPathsGiveTheSameBits) {
  jtok::Model m = test_model(tiny_moe_jtok_jtokm());
  expect_row_paths_agree("f32 tables, fp32 decoder", m, false);
  expect_row_paths_agree("f32 tables, bf16 decoder", m, true);
  tables_to_bf16(m);
  expect_row_paths_agree("bf16 tables, fp32 decoder", m, false);
  expect_row_paths_agree("bf16 tables, bf16 decoder", m, true);
  auto dec = jtok::cuda::make_device_decoder(m, decoder_settings(true, "auto"));  // bf16 tables in memory: in place
  EXPECT_NE(dec->describe().find("table rows in_place"), std::string::npos) << dec->describe();
}

// A pool of 4 pages (kv_tokens 64, page_tokens 16): a second sequence does not fit until the first
// closes; the error names the pages.
TEST(CudaDecoder, OpeningBeyondThePoolThrowsNamingPages) {
  const jtok::Model m = test_model(tiny_dense());
  DecoderSettings s = decoder_settings(false);
  s.kv_tokens = 64;
  auto dec = jtok::cuda::make_device_decoder(m, s);
  EXPECT_NE(dec->describe().find("4 pages of 16 positions"), std::string::npos) << dec->describe();
  const int64_t a = dec->open(50);
  jtok::testing::expect_error([&] { dec->open(16); }, {"page"});
  jtok::testing::expect_error([&] { dec->fork(a, 50); }, {"page"});
  dec->close(a);
  const int64_t b = dec->open(64);
  EXPECT_EQ(dec->length(b), 0);
  const std::vector<int32_t> p = skewed_ids(8, m.cfg.vocab_size, 71);
  std::vector<float> logits(static_cast<size_t>(m.cfg.vocab_size));
  dec->prefill(b, p.data(), 8, logits.data());
  dec->close(b);
  const int64_t small = dec->open(5);  // room for 5 positions: 8 do not fit
  jtok::testing::expect_error([&] { dec->prefill(small, p.data(), 8, logits.data()); }, {"8 more do not fit"});
  jtok::testing::expect_error([&] { dec->prefill(small, p.data(), 41, logits.data()); }, {"prefill of 41 tokens"});
}

// What the decoder does not run, refused by name.
TEST(CudaDecoder, RefusesWhatIsNotOnTheGpu) {
  jtok::ModelConfig c = tiny_dense();
  c.hidden_size = 64;  // 4 heads of 16
  const jtok::Model hd16 = test_model(c);
  jtok::testing::expect_error([&] { jtok::cuda::make_device_decoder(hd16, decoder_settings(false)); }, {"head_dim 16"});
  const jtok::Model m = test_model(tiny_jtok());
  jtok::testing::expect_error([&] { jtok::cuda::make_device_decoder(m, decoder_settings(false, "disk")); }, {"'disk'"});
  DecoderSettings huge = decoder_settings(false);
  huge.kv_tokens = int64_t{1} << 40;  // a KV pool of petabytes: the memory plan refuses before any allocation
  jtok::testing::expect_error([&] { jtok::cuda::make_device_decoder(m, huge); },
                              {"GPU memory plan needs", "GiB free", "KV pages", "--kv-budget-tokens"});
  auto dec = jtok::cuda::make_device_decoder(m, decoder_settings(false));
  EXPECT_NE(dec->describe().find("GPU memory plan"), std::string::npos) << dec->describe();
  const int64_t a = dec->open(kContext);
  const int64_t seqs[2] = {a, a};
  const int32_t toks[2] = {1, 2};
  std::vector<float> logits(static_cast<size_t>(2 * m.cfg.vocab_size));
  jtok::testing::expect_error([&] { dec->decode(seqs, toks, 2, logits.data()); }, {"repeats sequence"});
  const int32_t bad = static_cast<int32_t>(m.cfg.vocab_size);
  jtok::testing::expect_error([&] { dec->decode(&a, &bad, 1, logits.data()); }, {"outside the vocabulary"});
}

}  // namespace
