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
// the fused q | k | v), and a dense layer then an MoE layer with JTok and JTok-M (the experts read
// the dequantised copy). `--gtest_filter='CudaDecoderQ8.*'`; a GPU host only (in test_cuda_ops).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/decoder.h"
#include "infer/generate.h"
#include "model/lowp_weights.h"
#include "model_case.h"

namespace {

using namespace jtok::cuda_test;

constexpr int64_t kContext = 64;
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

int32_t argmax(const float* x, int64_t n) { return static_cast<int32_t>(std::max_element(x, x + n) - x); }

// Every logit of a run: each prompt's prefill, then kSteps decode steps of the 3 sequences, fed
// `forced` (M tokens a step) or greedily. fed: the tokens each step took.
struct Run {
  std::vector<float> logits;
  std::vector<std::vector<int32_t>> fed;
};

Run gpu_run(jtok::cuda::DeviceDecoder& dec, const jtok::ModelConfig& c, const Run* forced = nullptr) {
  const auto ps = prompts(c);
  const int64_t M = static_cast<int64_t>(ps.size()), V = c.vocab_size;
  std::vector<int64_t> seqs;
  std::vector<float> last(static_cast<size_t>(M * V));
  Run r;
  for (int64_t i = 0; i < M; ++i) {
    seqs.push_back(dec.open(kContext));
    const auto& p = ps[static_cast<size_t>(i)];
    dec.prefill(seqs.back(), p.data(), static_cast<int64_t>(p.size()), last.data() + i * V);
  }
  r.logits = last;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<int32_t> t(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) t[static_cast<size_t>(i)] = argmax(last.data() + i * V, V);
    r.fed.push_back(forced ? forced->fed[static_cast<size_t>(s)] : t);
    dec.decode(seqs.data(), r.fed.back().data(), M, last.data());
    r.logits.insert(r.logits.end(), last.begin(), last.end());
  }
  for (int64_t q : seqs) dec.close(q);
  return r;
}

Run cpu_run(const jtok::Model& m) {
  const auto ps = prompts(m.cfg);
  const int64_t M = static_cast<int64_t>(ps.size()), V = m.cfg.vocab_size;
  std::vector<jtok::KVCache> caches(ps.size());
  std::vector<jtok::KVCache*> ptrs;
  Run r;
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::vector<float> l = jtok::prefill(m, caches[i], ps[i], kContext);
    r.logits.insert(r.logits.end(), l.begin(), l.end());
    ptrs.push_back(&caches[i]);
  }
  std::vector<float> last = r.logits;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<int32_t> t(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) t[static_cast<size_t>(i)] = argmax(last.data() + i * V, V);
    r.fed.push_back(t);
    jtok::decode_batch(m, ptrs.data(), t.data(), M, last.data());
    r.logits.insert(r.logits.end(), last.begin(), last.end());
  }
  return r;
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
  const Run x = gpu_run(*a, c), y = gpu_run(*b, c);
  ASSERT_EQ(x.fed, y.fed) << name << ": greedy tokens differ";
  ASSERT_EQ(x.logits.size(), y.logits.size());
  EXPECT_EQ(0, std::memcmp(x.logits.data(), y.logits.data(), x.logits.size() * sizeof(float)))
      << name << ": the int8 products' logits differ from the dequantised weights'";
  // The decode steps did multiply int8 weights of the export's own values: against the CPU too.
  expect_close(name + " against the CPU", x.logits, cpu_run(ref).logits, 2e-5);
}

TEST(CudaDecoderQ8, Fp32IsTheDequantisedDecode) {
  expect_fp32_bits("qwen3 int8 fp32", tiny_qwen3());
  expect_fp32_bits("qwen2 int8 fp32", tiny_qwen2());
  expect_fp32_bits("dense + moe + jtok + jtokm int8 fp32", dense_then_moe_with_tables());
}

void expect_bf16_near_cpu(const std::string& name, const jtok::ModelConfig& c) {
  const auto [q, ref] = int8_and_dequantised(c);
  const Run cpu = cpu_run(ref);
  auto dec = jtok::cuda::make_device_decoder(q, decoder_settings(true));
  const Run gpu = gpu_run(*dec, c, &cpu);
  expect_close(name + " logits", gpu.logits, cpu.logits, 5e-2);
  const int64_t V = c.vocab_size, rows = static_cast<int64_t>(cpu.logits.size()) / V;
  int64_t agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* w = cpu.logits.data() + r * V;
    const int32_t g = argmax(gpu.logits.data() + r * V, V), best = argmax(w, V);
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
}

}  // namespace
