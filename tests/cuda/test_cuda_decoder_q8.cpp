// The GPU decoder on an int8 export with its decode steps reading the int8 matrices as stored
// (DecoderSettings::int8_decode, cuda/decoder_q8.cu; the products row_invariant_linear_q8 /
// row_invariant_swiglu_q8), made by convert_model_to_lowp (the model an export loads as):
// - fp32: the logits of prefills and 8 greedy steps of 3 sequences (CUDA graphs on) equal, bit for
//   bit, the same decoder's with int8_decode off (the matrices dequantised at load, q * scale in
//   fp32: the value the int8 products compute as they load); describe() says which it is.
// - bf16: within 5e-2 of the CPU's fp32 engine on the dequantised weights, teacher-forced on its
//   greedy tokens, top-1 the CPU's on at least 3 of 4 predictions (a disagreement only at a near tie;
//   every expert and JTok-M table taken, so no top-K choice flips).
// - int8_only (every int8 matrix in int8 alone: the layers', the LM head, the embedding): the decode
//   steps' logits, fed on's tokens, bit for bit int8_decode on's (prefills multiply the layers'
//   matrices dequantised into the one layer's scratch, decode steps the int8 ones, the embedding's
//   rows dequantised as gathered: the copy's bits); the prefills' logits (the head's int8 product,
//   on's the copy's) within the fp32 / bf16 bounds, every position of a prefill too; holding the
//   copy's int8 matrices, less one layer's scratch and an untied embedding's int8 bytes, fewer bytes
//   of device memory, as the memory plan says; a model that is not an int8 export refused by name.
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
#include "cuda/decoder_sizes.h"
#include "cuda/device.h"
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

// a's and b's logits of the same runs, bit for bit (the greedy tokens fed alike); a's returned.
std::vector<float> expect_same_logits(const std::string& name, const jtok::ModelConfig& c, jtok::cuda::DeviceDecoder& a,
                                      jtok::cuda::DeviceDecoder& b, const std::string& b_is) {
  const auto ps = prompts(c);
  const Run x = gpu_run(a, c, ps, kSteps), y = gpu_run(b, c, ps, kSteps);
  EXPECT_EQ(x.fed, y.fed) << name << ": greedy tokens differ from " << b_is;
  const std::vector<float> xl = all_logits(x), yl = all_logits(y);
  EXPECT_TRUE(xl.size() == yl.size() && std::memcmp(xl.data(), yl.data(), xl.size() * sizeof(float)) == 0)
      << name << ": the logits differ from " << b_is;
  return xl;
}

void expect_fp32_bits(const std::string& name, const jtok::ModelConfig& c) {
  const auto [q, ref] = int8_and_dequantised(c);
  jtok::cuda::DecoderSettings on = decoder_settings(false), off = on;
  off.int8_decode = false;
  auto a = jtok::cuda::make_device_decoder(q, on), b = jtok::cuda::make_device_decoder(q, off);
  std::printf("%s\n", a->describe().c_str());
  EXPECT_NE(a->describe().find("decode steps read the int8 matrices as stored"), std::string::npos) << a->describe();
  EXPECT_EQ(b->describe().find("decode steps read the int8"), std::string::npos) << b->describe();
  const std::vector<float> xl = expect_same_logits(name, c, *a, *b, "the dequantised weights'");
  // The decode steps did multiply int8 weights of the export's own values: against the CPU too.
  expect_close(name + " against the CPU", xl, all_logits(cpu_run(ref, prompts(c), kSteps)), 2e-5);
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

// Every position's logits of a 37-token prefill (an untied int8_only head's: its int8 product for
// every row, not only a decode step's) within tol of b's (int8_decode on: the copy's head, cuBLASLt).
void expect_every_position_close(const std::string& name, const jtok::ModelConfig& c, jtok::cuda::DeviceDecoder& a,
                                 jtok::cuda::DeviceDecoder& b, double tol) {
  const std::vector<int32_t> p = skewed_ids(37, c.vocab_size, 44);
  const int64_t V = c.vocab_size;
  std::vector<std::vector<float>> each(2, std::vector<float>(p.size() * static_cast<size_t>(V), -1.0f));
  std::vector<float> last(static_cast<size_t>(V));
  for (int i = 0; i < 2; ++i) {
    jtok::cuda::DeviceDecoder& dec = i == 0 ? a : b;
    const int64_t seq = dec.open(64);
    dec.prefill(seq, p.data(), static_cast<int64_t>(p.size()), last.data(),
                [&](int64_t pos, int64_t n, const float* l) {
                  std::copy(l, l + n * V, each[static_cast<size_t>(i)].begin() + pos * V);
                });
    dec.close(seq);
  }
  expect_close(name + " every position of a prefill", each[0], each[1], tol);
}

void expect_int8_only_is_int8_decode(const std::string& name, const jtok::ModelConfig& c, bool bf16) {
  const auto [q, ref] = int8_and_dequantised(c);
  jtok::cuda::DecoderSettings on = decoder_settings(bf16), only = on;
  only.int8_only = true;
  const int64_t before = jtok::cuda::device_bytes_now();
  auto a = jtok::cuda::make_device_decoder(q, on);
  const int64_t held_on = jtok::cuda::device_bytes_now() - before;
  auto b = jtok::cuda::make_device_decoder(q, only);
  const int64_t held_only = jtok::cuda::device_bytes_now() - before - held_on;
  std::printf("%s\n", b->describe().c_str());
  EXPECT_NE(b->describe().find("the embedding's rows dequantised as gathered"), std::string::npos) << b->describe();
  // Every int8 matrix leaves the copy; an untied embedding's int8 bytes and one layer's scratch come in.
  const jtok::cuda::DecoderQ8Sizes z = jtok::cuda::decoder_q8_sizes(c, true), z_on = jtok::cuda::decoder_q8_sizes(c);
  const int64_t eb = bf16 ? 2 : 4, saved = eb * (z.values - z.max_layer_values) - (z.bytes() - z_on.bytes());
  EXPECT_EQ(z.values - z_on.values, c.tie_word_embeddings ? 0 : c.padded_vocab() * c.hidden_size) << name;
  EXPECT_GT(saved, 0) << name;
  EXPECT_EQ(held_on - held_only, saved) << name << ": device bytes " << held_on << " (on) and " << held_only
                                        << " (only)";
  EXPECT_EQ(
      jtok::cuda::decoder_memory_plan(c, on, true).total() - jtok::cuda::decoder_memory_plan(c, only, true).total(),
      saved)
      << name << ": the plan";
  // The prefills' logits are the head's int8 product's (on's: the copy's cuBLASLt product): close; the
  // decode steps (the int8 head in both) fed on's tokens, bit for bit.
  const double tol = bf16 ? 5e-2 : 2e-5;
  const auto ps = prompts(c);
  const Run x = gpu_run(*a, c, ps, kSteps), y = gpu_run(*b, c, ps, kSteps, &x);
  expect_close(name + " prefills", concat(y.prefill), concat(x.prefill), tol);
  const std::vector<float> xs = concat(x.logits), ys = concat(y.logits);
  EXPECT_TRUE(xs.size() == ys.size() && std::memcmp(xs.data(), ys.data(), xs.size() * sizeof(float)) == 0)
      << name << ": the decode steps' logits differ from int8_decode on's";
  expect_every_position_close(name, c, *b, *a, tol);
}

TEST(CudaDecoderQ8, Int8OnlyIsInt8DecodeWithLessMemory) {
  expect_int8_only_is_int8_decode("qwen3 int8 only fp32", tiny_qwen3(), false);
  expect_int8_only_is_int8_decode("dense + moe + jtok + jtokm int8 only bf16", dense_then_moe_with_tables(), true);
  expect_int8_only_is_int8_decode("moe + shared expert + jtok + jtokm int8 only fp32", tiny_moe_jtok_jtokm(), false);
  jtok::cuda::DecoderSettings only = decoder_settings(false);
  only.int8_only = true;
  const jtok::Model fp32 = test_model(tiny_qwen3());
  try {
    jtok::cuda::make_device_decoder(fp32, only);
    ADD_FAILURE() << "int8_only on an fp32 model was not refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--int8-decode only"), std::string::npos) << e.what();
  }
}

}  // namespace
