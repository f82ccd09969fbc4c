// The GPU decoder on an int8 export with its decode steps reading the int8 matrices as stored
// (DecoderSettings::int8_decode, cuda/decoder_q8.cu; the products row_invariant_linear_q8 /
// row_invariant_swiglu_q8), made by convert_model_to_lowp (the model an export loads as):
// - fp32: the logits of prefills and 8 greedy steps of 3 sequences (CUDA graphs on) equal, bit for
//   bit, the same decoder's with int8_decode off (the matrices dequantised at load, q * scale in
//   fp32: the value the int8 products compute as they load); describe() says which it is.
// - bf16: within 5e-2 of the CPU's fp32 engine on the dequantised weights, teacher-forced on its
//   greedy tokens, top-1 the CPU's on at least 3 of 4 predictions (a disagreement only at a near tie;
//   every expert and JTok-M table taken, so no top-K choice flips).
// Models: Qwen3's shape (q / k norms, GQA, tied head: the embedding's int8 rows), Qwen2's (biases on
// the fused q | k | v), a dense layer then an MoE layer with JTok and JTok-M, and two MoE layers
// with a shared expert, JTok and JTok-M (the experts' int8 products, grouped on the device).
// `--gtest_filter='CudaDecoderQ8.*'`; a GPU host only (in test_cuda_ops).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/decoder.h"
#include "decoder_runs.h"
#include "infer/generate.h"
#include "model/lowp_weights.h"
#include "model_case.h"

namespace {

using namespace jtok::cuda_test;

constexpr int kSteps = 8;

jtok::ModelConfig dense_then_moe_with_tables() {
  jtok::ModelConfig c = tiny_moe();  // layer 0 dense, layer 1 MoE
  c.jtok = true;
  c.jtok_layers = std::string("0");
  c.jtokm = true;
  c.jtokm_n_e = 3;
  c.jtokm_top_k = 2;
  return c;
}

std::vector<std::vector<int32_t>> prompts(const jtok::ModelConfig& c) {
  return {skewed_ids(5, c.vocab_size, 41), skewed_ids(17, c.vocab_size, 42), skewed_ids(33, c.vocab_size, 43)};
}

// Every logit of a run (decoder_runs.h): each prompt's prefill, then each decode step's.
std::vector<float> all_logits(const Run& r) {
  std::vector<float> out = concat(r.prefill);
  const std::vector<float> steps = concat(r.logits);
  out.insert(out.end(), steps.begin(), steps.end());
  return out;
}

// c's test model as an int8 export loads, and the fp32 model of its dequantised matrices.
std::pair<jtok::Model, jtok::Model> int8_and_dequantised(const jtok::ModelConfig& c) {
  jtok::Model q = test_model(c);
  jtok::convert_model_to_lowp(q, jtok::Dtype::int8);
  jtok::Model ref = test_model(c);
  jtok::params_block_f32(q, jtok::lowp_slots(q), ref.params.data(), 0, static_cast<int64_t>(ref.params.size()));
  return {std::move(q), std::move(ref)};
}

void expect_fp32_bits(const std::string& name, const jtok::ModelConfig& c) {
  const auto [q, ref] = int8_and_dequantised(c);
  jtok::cuda::DecoderSettings on = decoder_settings(false), off = on;
  off.int8_decode = false;
  auto a = jtok::cuda::make_device_decoder(q, on), b = jtok::cuda::make_device_decoder(q, off);
  std::printf("%s\n", a->describe().c_str());
  EXPECT_NE(a->describe().find("decode steps read the int8 matrices as stored"), std::string::npos) << a->describe();
  EXPECT_EQ(b->describe().find("decode steps read the int8"), std::string::npos) << b->describe();
  const auto ps = prompts(c);
  const Run x = gpu_run(*a, c, ps, kSteps), y = gpu_run(*b, c, ps, kSteps);
  ASSERT_EQ(x.fed, y.fed) << name << ": greedy tokens differ";
  const std::vector<float> xl = all_logits(x), yl = all_logits(y);
  ASSERT_EQ(xl.size(), yl.size());
  EXPECT_EQ(0, std::memcmp(xl.data(), yl.data(), xl.size() * sizeof(float)))
      << name << ": the int8 products' logits differ from the dequantised weights'";
  // The decode steps did multiply int8 weights of the export's own values: against the CPU too.
  expect_close(name + " against the CPU", xl, all_logits(cpu_run(ref, ps, kSteps)), 2e-5);
}

TEST(CudaDecoderQ8, Fp32IsTheDequantisedDecode) {
  expect_fp32_bits("qwen3 int8 fp32", tiny_qwen3());
  expect_fp32_bits("qwen2 int8 fp32", tiny_qwen2());
  expect_fp32_bits("dense + moe + jtok + jtokm int8 fp32", dense_then_moe_with_tables());
  expect_fp32_bits("moe + shared expert + jtok + jtokm int8 fp32", tiny_moe_jtok_jtokm());
}

void expect_bf16_near_cpu(const std::string& name, const jtok::ModelConfig& c) {
  const auto [q, ref] = int8_and_dequantised(c);
  const auto ps = prompts(c);
  const Run cpu = cpu_run(ref, ps, kSteps);
  auto dec = jtok::cuda::make_device_decoder(q, decoder_settings(true));
  const std::vector<float> want = all_logits(cpu), got = all_logits(gpu_run(*dec, c, ps, kSteps, &cpu));
  expect_close(name + " logits", got, want, 5e-2);
  const int64_t V = c.vocab_size, rows = static_cast<int64_t>(want.size()) / V;
  int64_t agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* w = want.data() + r * V;
    const int32_t g = argmax(got.data() + r * V, V), best = argmax(w, V);
    agree += g == best;
    EXPECT_LE(w[best] - w[g], 0.05f * (w[best] - *std::min_element(w, w + V))) << name << " row " << r;
  }
  std::printf("cuda decoder %s top-1 agreement %lld / %lld\n", name.c_str(), static_cast<long long>(agree),
              static_cast<long long>(rows));
  EXPECT_GE(4 * agree, 3 * rows) << name;
}

// bf16 against fp32: every token takes all its experts and JTok-M tables (top 4 of 4, 3 of 3), so no
// top-K choice flips at a near tie (an O(1) change no tolerance tells from a bug; fp32 checks them).
TEST(CudaDecoderQ8, Bf16NearCpu) {
  expect_bf16_near_cpu("qwen3 int8 bf16", tiny_qwen3());
  jtok::ModelConfig c = dense_then_moe_with_tables();
  c.num_experts_per_tok = 4;
  c.jtokm_top_k = 3;
  expect_bf16_near_cpu("dense + moe + jtok + jtokm int8 bf16", c);
  c = tiny_moe_jtok_jtokm();
  c.num_experts_per_tok = 4;
  c.jtokm_top_k = 3;
  expect_bf16_near_cpu("moe + shared expert + jtok + jtokm int8 bf16", c);
}

}  // namespace
