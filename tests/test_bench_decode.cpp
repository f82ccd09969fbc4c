// `jtok bench-decode`'s parts: the random inference model (model/inference_model.h) has make_model's
// values (f32 tables bit for bit, bf16 tables their rounding) or its tables the hash's rows, and its
// table bytes are counted; the
// bench's greedy pick is sample_token's; the bench's prompts are the loader's sequential windows;
// its decode run feeds each step the token the last logits chose (its tokens hash equals that of
// prefill + decode_step + sample_token greedy, one sequence at a time).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/loader.h"
#include "data/shard.h"
#include "infer/bench_decode.h"
#include "infer/generate.h"
#include "model/inference_model.h"
#include "model/lowp_weights.h"
#include "model_test_util.h"

using namespace jtok;
using namespace jtok::testing;

namespace {

ModelConfig test_config() {
  TinyJtokShape s;
  s.layers = 3;
  s.jtok_layers = "0";
  s.jtokm_layers = "1-2";
  return tiny_jtok_config(s);
}

// A directory with one shard of n ids below V, removed at the end of the test.
struct ShardDir {
  std::string dir;
  ShardDir(int64_t n, int64_t V) {
    dir = (std::filesystem::temp_directory_path() / ("bench_decode_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::mt19937 rng(40);
    for (int32_t& t : ids) t = static_cast<int32_t>(rng() % V);
    ShardInfo info;
    info.vocab_size = static_cast<uint32_t>(V);
    write_shard(dir + "/train_000000.bin", info, ids);
  }
  ~ShardDir() { std::filesystem::remove_all(dir); }
};

}  // namespace

TEST(InferenceModel, F32TablesAreMakeModels) {
  const ModelConfig c = test_config();
  const Model want = make_model(c, 7);
  const Model got = make_inference_model(c, 7, Dtype::f32);
  EXPECT_TRUE(got.grads.empty());
  ASSERT_EQ(got.params.size(), want.params.size());
  EXPECT_EQ(std::memcmp(got.params.data(), want.params.data(), want.params.size() * sizeof(float)), 0);
  ASSERT_EQ(got.tables.size(), want.tables.size());
  ASSERT_EQ(got.tables.size(), 1u + 2u * 3u);  // JTok on layer 0, JTok-M (n_e 3) on layers 1-2
  for (size_t k = 0; k < want.tables.size(); ++k) EXPECT_EQ(got.tables[k].to_vector(), want.tables[k].to_vector()) << k;
  EXPECT_EQ(table_bytes(c, Dtype::f32), 7 * c.padded_vocab() * c.hidden_size * 4);
  EXPECT_EQ(table_bytes(c, Dtype::bf16), 7 * c.padded_vocab() * c.hidden_size * 2);
}

TEST(InferenceModel, Bf16TablesAreTheRoundedOnes) {
  const ModelConfig c = test_config();
  const Model want = make_model(c, 7);
  const Model got = make_inference_model(c, 7, Dtype::bf16);
  for (size_t k = 0; k < want.tables.size(); ++k) {
    ASSERT_EQ(got.tables[k].dtype(), Dtype::bf16);
    EXPECT_EQ(got.tables[k].storage_bytes(), c.padded_vocab() * c.hidden_size * 2);
    EXPECT_EQ(got.tables[k].to_vector(), quantize_table(want.tables[k], Dtype::bf16).to_vector()) << k;
  }
  EXPECT_THROW(make_inference_model(c, 7, Dtype::int8), Error);
}

// --table-values hash: make_model's backbone, each table row hash_table_row's (the same from a model
// without tables), padded rows 0, bf16 their rounding; the values look like N(0, std) (mean, spread,
// the four uniforms' bound) and differ between tables and seeds.
TEST(InferenceModel, HashTablesAreHashRowsOnMakeModelsBackbone) {
  const ModelConfig c = test_config();
  const Model want = make_model(c, 7);
  const Model got = make_inference_model(c, 7, Dtype::f32, TableValues::hash);
  const Model shape = make_inference_model_without_tables(c, 7);
  ASSERT_EQ(got.params.size(), want.params.size());
  EXPECT_EQ(std::memcmp(got.params.data(), want.params.data(), want.params.size() * sizeof(float)), 0);
  ASSERT_EQ(got.tables.size(), 7u);
  const int64_t d = c.hidden_size;
  std::vector<float> row(static_cast<size_t>(d));
  double sum = 0, sq = 0, most = 0;
  int64_t n = 0, mismatched = 0, nonzero_padding = 0;
  for (size_t k = 0; k < got.tables.size(); ++k) {
    const std::vector<float> t = got.tables[k].to_vector();
    const double std = got.table_init[k].std;
    for (int64_t r = 0; r < c.padded_vocab(); ++r) {
      hash_table_row(shape, 7, static_cast<int64_t>(k), r, row.data());
      mismatched += std::memcmp(row.data(), t.data() + r * d, sizeof(float) * static_cast<size_t>(d)) != 0;
      for (int64_t j = 0; j < d; ++j) {
        const double x = t[static_cast<size_t>(r * d + j)] / std;
        if (r >= c.vocab_size) {
          nonzero_padding += x != 0;
          continue;
        }
        sum += x, sq += x * x, most = std::max(most, std::abs(x)), ++n;
      }
    }
  }
  EXPECT_EQ(mismatched, 0);
  EXPECT_EQ(nonzero_padding, 0);
  EXPECT_LT(std::abs(sum / n), 0.03) << n << " values";               // ~4.4 standard errors
  EXPECT_NEAR(std::sqrt(sq / n - (sum / n) * (sum / n)), 1.0, 0.03);  // ~7 standard errors
  EXPECT_LE(most, std::sqrt(12.0));
  EXPECT_GT(most, 2.5);
  EXPECT_NE(got.tables[1].to_vector(), got.tables[2].to_vector());
  EXPECT_NE(make_inference_model(c, 8, Dtype::f32, TableValues::hash).tables[0].to_vector(), got.tables[0].to_vector());
  const Model bf16 = make_inference_model(c, 7, Dtype::bf16, TableValues::hash);
  for (size_t k = 0; k < got.tables.size(); ++k)
    EXPECT_EQ(bf16.tables[k].to_vector(), quantize_table(got.tables[k], Dtype::bf16).to_vector()) << k;
  EXPECT_EQ(parse_table_values("init", "--table-values"), TableValues::init);
  EXPECT_THROW(parse_table_values("normal", "--table-values"), Error);
}

TEST(BenchDecode, GreedyIsSampleTokens) {
  const int64_t V = 50;
  std::vector<float> logits(3 * V);
  std::mt19937 rng(3);
  for (float& x : logits) x = static_cast<float>(rng() % 7);  // many ties
  int32_t got[3];
  greedy_tokens(logits.data(), 3, V, got);
  std::mt19937_64 r64(1);
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> row(logits.begin() + i * V, logits.begin() + (i + 1) * V);
    EXPECT_EQ(got[i], sample_token(row, {.temperature = 0}, r64)) << i;
  }
}

TEST(BenchDecode, PromptsAreTheLoadersWindows) {
  ShardDir d(400, 97);
  const std::vector<int32_t> p = shard_prompts(d.dir, 3, 20, 97);
  LoaderOptions lo;
  lo.mode = "sequential";
  DataLoader loader(list_shards(d.dir), lo);
  EXPECT_EQ(p, loader.next_batch(3, 20).inputs);
  EXPECT_THROW(shard_prompts(d.dir, 1, 20, 50), Error);  // ids past a smaller vocabulary
}

// The decode run's tokens: each sequence's prefill argmax, then N steps each fed the last choice.
TEST(BenchDecode, TokensAreGreedyDecoding) {
  const Model m = make_inference_model(test_config(), 5, Dtype::f32);
  const int64_t V = m.cfg.vocab_size, M = 2, P = 6, N = 4;
  ShardDir d(400, V);
  BenchDecodeOptions opt;
  opt.batches = {M};
  opt.prompt_len = P;
  opt.new_tokens = N;
  opt.long_prompt = 10;
  opt.repeat = 1;
  opt.data = d.dir;
  const std::vector<nlohmann::json> lines = bench_decode(m, opt);
  ASSERT_EQ(lines.size(), 2u);
  const std::vector<int32_t> prompts = shard_prompts(d.dir, M, P, V);
  std::vector<int32_t> want;
  std::mt19937_64 rng(1);
  for (int64_t i = 0; i < M; ++i) {
    KVCache cache;
    std::vector<float> logits = prefill(m, cache, {prompts.begin() + i * P, prompts.begin() + (i + 1) * P}, P + N);
    for (int64_t s = 0; s <= N; ++s) {
      want.push_back(sample_token(logits, {.temperature = 0}, rng));
      if (s < N) logits = decode_step(m, cache, want.back());
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(fnv1a64(want.data(), want.size() * sizeof(int32_t))));
  const nlohmann::json& j = lines[0];
  EXPECT_EQ(j["run"], "decode");
  EXPECT_EQ(j["tokens_fnv1a"], hex);
  EXPECT_EQ(j["batch"], M);
  EXPECT_GT(j["decode_tok_s"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(j["tpot_ms"].get<double>(), 1e3 * M / j["decode_tok_s"].get<double>());
  EXPECT_EQ(lines[1]["run"], "prefill");
  EXPECT_EQ(lines[1]["prompt"], 10);
}

// The weight bytes a decode step reads, by hand: test_config (d 32, 3 layers, 4 / 2 heads of 8, F 48,
// vocab 97 padded to 128; JTok-M on layers 1-2, n_e tables each) has per layer q | k | v 64 x 32,
// o 32 x 32, gate | up 96 x 32, down 32 x 48, the head 128 x 32, and JTok-M's routers (n_e x 32).
TEST(BenchDecode, StepWeightBytesByHand) {
  ModelConfig c = test_config();
  const int64_t d = 32, matrices = 3 * (64 * d + 32 * 32 + 96 * d + 32 * 48) + 128 * d,
                rows = 3 * (64 + 32 + 96 + 32) + 128;
  const int64_t routers = 2 * c.jtokm_n_e * d;
  Model m = make_inference_model(c, 5, Dtype::f32);
  cuda::DecoderSettings s;  // bf16
  EXPECT_EQ(step_weight_bytes(m, "cpu", s), 4 * matrices + 4 * routers);
  EXPECT_EQ(step_weight_bytes(m, "cuda", s), 2 * matrices + 2 * routers);
  s.bf16 = false;
  EXPECT_EQ(step_weight_bytes(m, "cuda", s), 4 * matrices + 4 * routers);
  convert_model_to_lowp(m, Dtype::int8);
  EXPECT_EQ(step_weight_bytes(m, "cpu", s), matrices + 4 * rows + 4 * routers);
  EXPECT_EQ(step_weight_bytes(m, "cuda", s), matrices + 4 * rows + 4 * routers);
  s.int8_decode = false;
  EXPECT_EQ(step_weight_bytes(m, "cuda", s), 4 * matrices + 4 * routers);  // the dequantised copy
  // An MoE layer: its router and shared experts instead of the dense MLP (its routed experts not counted).
  c.model_type = "jtok_moe";  // layers 1-2: 8 experts, one shared of 256
  Model moe = make_inference_model(c, 5, Dtype::f32);
  const int64_t moe_matrices = matrices - 2 * (96 * d + 32 * 48);
  EXPECT_EQ(step_weight_bytes(moe, "cpu", cuda::DecoderSettings{}),
            4 * (moe_matrices + 2 * (8 * d + 3 * 256 * d) + routers));
  convert_model_to_lowp(moe, Dtype::int8);  // the GPU's int8 decode: shared experts in int8, routers in bf16
  const int64_t moe_rows = rows - 2 * (96 + 32) + 2 * (2 * 256 + d);
  EXPECT_EQ(step_weight_bytes(moe, "cuda", cuda::DecoderSettings{}),
            moe_matrices + 2 * 3 * 256 * d + 4 * moe_rows + 2 * (2 * 8 * d + routers));
  // A whole step of the bench carries it, and its bandwidth over the TPOT.
  ShardDir dir(400, c.vocab_size);
  BenchDecodeOptions opt;
  opt.prompt_len = 6;
  opt.new_tokens = 3;
  opt.repeat = 1;
  opt.data = dir.dir;
  const nlohmann::json j = bench_decode(m, opt).at(0);
  EXPECT_EQ(j["step_weight_bytes"], matrices + 4 * rows + 4 * routers);
  EXPECT_NEAR(j["weight_gbs"].get<double>(), j["step_weight_bytes"].get<double>() / j["tpot_ms"].get<double>() / 1e6,
              1e-9 * j["weight_gbs"].get<double>());
}
