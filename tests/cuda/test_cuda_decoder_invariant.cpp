// A decode step's logits do not depend on the other sequences in the step (issue 40; the decode
// steps' products are cuda/row_invariant_linear.h's, cuda/decoder_step.cu): one sequence decoded
// alone for 12 greedy steps, then the same prompt decoded among 7 others (prompts of 3 to 30
// tokens) in steps of 8, 5, 3, 8, 2 and 6 sequences (batch buckets 8, 8, 4, 8, 2, 8: dummy rows in
// some), the watched one at a different place each step and fed the tokens it got alone: its logits
// bit for bit the alone run's at every step. bf16 (weights, activations, KV pages) with CUDA graphs
// on and off, and fp32; models: Qwen3's shape (qk_norm), Qwen2's (q/k/v biases), JTok + JTok-M (the
// router, the tables' rows), MoE + JTok + JTok-M (the router's and the experts' grouped products take
// the kernel too; graphs on and off). With the decode products on the tensor cores
// (DecoderSettings::tensor_cores, cuda/row_invariant_mma.h) the same, and the watched sequence's logits
// alone within bf16's bound of the CUDA-core kernel's, its greedy tokens the same.
// `--gtest_filter='CudaDecoderInvariant.*'`; a GPU host only (in test_cuda_ops).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda/decoder.h"
#include "model/transformer.h"
#include "model_case.h"

namespace {

using namespace jtok::cuda_test;
using jtok::cuda::DecoderSettings;
using jtok::cuda::DeviceDecoder;

constexpr int64_t kContext = 64;  // model_case.h's max_position_embeddings
constexpr int kSteps = 12;
constexpr int64_t kOthers = 7;
constexpr int64_t kGroups[] = {8, 5, 3, 8, 2, 6};  // step s: kGroups[s % 6] sequences, the watched one among them

// model_case.h's decoder with steps of up to 8 sequences.
DecoderSettings settings(bool bf16, bool graphs, bool tensor_cores = false) {
  DecoderSettings s = decoder_settings(bf16);
  s.max_batch = 8;
  s.kv_tokens = 16 * kContext;  // 8 sequences open at once with room to spare
  s.cuda_graphs = graphs;
  s.tensor_cores = tensor_cores;
  return s;
}

int32_t argmax(const float* x, int64_t n) { return static_cast<int32_t>(std::max_element(x, x + n) - x); }

struct Watched {
  std::vector<int32_t> fed;   // per step
  std::vector<float> logits;  // per step (V), back to back
};

std::vector<int32_t> watched_prompt(const jtok::ModelConfig& c) { return skewed_ids(9, c.vocab_size, 70); }

Watched decode_alone(DeviceDecoder& dec, const jtok::ModelConfig& c) {
  const int64_t V = c.vocab_size;
  const std::vector<int32_t> p = watched_prompt(c);
  std::vector<float> l(static_cast<size_t>(V));
  const int64_t seq = dec.open(kContext);
  dec.prefill(seq, p.data(), static_cast<int64_t>(p.size()), l.data());
  Watched w;
  for (int s = 0; s < kSteps; ++s) {
    w.fed.push_back(argmax(l.data(), V));
    dec.decode(&seq, &w.fed.back(), 1, l.data());
    w.logits.insert(w.logits.end(), l.begin(), l.end());
  }
  dec.close(seq);
  return w;
}

// The watched prompt among kOthers others, fed alone's tokens (the others their greedy ones): its
// logits per step.
std::vector<float> decode_among_others(DeviceDecoder& dec, const jtok::ModelConfig& c,
                                       const std::vector<int32_t>& fed) {
  const int64_t V = c.vocab_size;
  std::vector<float> l(static_cast<size_t>(8 * V));
  const std::vector<int32_t> p = watched_prompt(c);
  const int64_t watched = dec.open(kContext);
  dec.prefill(watched, p.data(), static_cast<int64_t>(p.size()), l.data());
  std::vector<int64_t> others;
  std::vector<int32_t> next;
  for (int64_t i = 0; i < kOthers; ++i) {
    const std::vector<int32_t> q = skewed_ids(3 + 4 * i, c.vocab_size, 71 + static_cast<uint64_t>(i));
    others.push_back(dec.open(kContext));
    dec.prefill(others.back(), q.data(), static_cast<int64_t>(q.size()), l.data());
    next.push_back(argmax(l.data(), V));
  }
  std::vector<float> out;
  for (int s = 0; s < kSteps; ++s) {
    const int64_t M = kGroups[s % 6], place = s % M;
    std::vector<int64_t> seqs, who;  // who: the other's index, -1 the watched
    for (int64_t i = 0, k = 0; i < M; ++i) {
      const int64_t o = i == place ? -1 : (s + k++) % kOthers;
      who.push_back(o);
      seqs.push_back(o < 0 ? watched : others[static_cast<size_t>(o)]);
    }
    std::vector<int32_t> tokens;
    for (int64_t o : who) tokens.push_back(o < 0 ? fed[static_cast<size_t>(s)] : next[static_cast<size_t>(o)]);
    dec.decode(seqs.data(), tokens.data(), M, l.data());
    out.insert(out.end(), l.begin() + place * V, l.begin() + (place + 1) * V);
    for (int64_t i = 0; i < M; ++i) {
      const int64_t o = who[static_cast<size_t>(i)];
      if (o >= 0) next[static_cast<size_t>(o)] = argmax(l.data() + i * V, V);
    }
  }
  dec.close(watched);
  for (int64_t q : others) dec.close(q);
  return out;
}

void expect_batch_invariant(const std::string& name, const jtok::ModelConfig& c, bool bf16, bool graphs,
                            bool tensor_cores = false) {
  const jtok::Model m = test_model(c);
  auto dec = jtok::cuda::make_device_decoder(m, settings(bf16, graphs, tensor_cores));
  const Watched alone = decode_alone(*dec, c);
  const std::vector<float> among = decode_among_others(*dec, c, alone.fed);
  ASSERT_EQ(among.size(), alone.logits.size()) << name;
  const size_t V = static_cast<size_t>(c.vocab_size);
  for (int s = 0; s < kSteps; ++s)
    EXPECT_EQ(0, std::memcmp(among.data() + s * V, alone.logits.data() + s * V, V * sizeof(float)))
        << name << ": step " << s << " (" << kGroups[s % 6] << " sequences) differs from the sequence alone; "
        << dec->describe();
}

TEST(CudaDecoderInvariant, Qwen3LogitsAloneEqualInABatch) {
  const jtok::ModelConfig c = tiny_qwen3();
  expect_batch_invariant("qwen3 bf16 graphs", c, true, true);
  expect_batch_invariant("qwen3 bf16 eager", c, true, false);
  expect_batch_invariant("qwen3 fp32 graphs", c, false, true);
}

TEST(CudaDecoderInvariant, Qwen2BiasesLogitsAloneEqualInABatch) {
  expect_batch_invariant("qwen2 bf16 graphs", tiny_qwen2(), true, true);
  expect_batch_invariant("qwen2 bf16 eager", tiny_qwen2(), true, false);
}

TEST(CudaDecoderInvariant, JtokJtokmLogitsAloneEqualInABatch) {
  expect_batch_invariant("jtok+jtokm bf16 graphs", tiny_jtok_jtokm(), true, true);
  expect_batch_invariant("jtok+jtokm bf16 eager", tiny_jtok_jtokm(), true, false);
}

TEST(CudaDecoderInvariant, MoeLogitsAloneEqualInABatch) {
  expect_batch_invariant("moe+jtok+jtokm bf16 graphs", tiny_moe_jtok_jtokm(), true, true);
  expect_batch_invariant("moe+jtok+jtokm bf16 eager", tiny_moe_jtok_jtokm(), true, false);
}

TEST(CudaDecoderInvariant, TensorCoreProductsLogitsAloneEqualInABatch) {
  expect_batch_invariant("qwen3 bf16 tensor cores graphs", tiny_qwen3(), true, true, true);
  expect_batch_invariant("qwen3 bf16 tensor cores eager", tiny_qwen3(), true, false, true);
  expect_batch_invariant("qwen2 bf16 tensor cores graphs", tiny_qwen2(), true, true, true);
  expect_batch_invariant("jtok+jtokm bf16 tensor cores graphs", tiny_jtok_jtokm(), true, true, true);
  expect_batch_invariant("moe+jtok+jtokm bf16 tensor cores graphs", tiny_moe_jtok_jtokm(), true, true, true);
}

// The watched sequence alone, tensor cores against CUDA cores: its logits within bf16's bound
// (normalised error 5e-2, as the bf16 decoder against the CPU's fp32) at every step both were fed the
// same token (the first always: the prefills are the same cuBLASLt products; a later greedy token may
// differ at a near tie), not the same bits; and the decoder says which it is.
TEST(CudaDecoderInvariant, TensorCoreProductsNearTheCudaCores) {
  for (const auto& [name, c] :
       {std::pair<std::string, jtok::ModelConfig>{"qwen3", tiny_qwen3()}, {"jtok+jtokm", tiny_jtok_jtokm()}}) {
    const jtok::Model m = test_model(c);
    auto cores = jtok::cuda::make_device_decoder(m, settings(true, true, false));
    auto tensor = jtok::cuda::make_device_decoder(m, settings(true, true, true));
    EXPECT_NE(tensor->describe().find("decode products on the tensor cores"), std::string::npos) << tensor->describe();
    EXPECT_EQ(cores->describe().find("tensor cores"), std::string::npos) << cores->describe();
    const Watched a = decode_alone(*cores, c), b = decode_alone(*tensor, c);
    ASSERT_EQ(a.fed[0], b.fed[0]) << name << ": the prefills differ";
    const size_t same =
        static_cast<size_t>(std::mismatch(a.fed.begin(), a.fed.end(), b.fed.begin()).first - a.fed.begin());
    const size_t V = static_cast<size_t>(c.vocab_size);
    const std::vector<float> la(a.logits.begin(), a.logits.begin() + same * V),
        lb(b.logits.begin(), b.logits.begin() + same * V);
    EXPECT_LE(jtok::testing::rel_err(lb, la), 5e-2) << name << " over the first " << same << " steps";
    EXPECT_NE(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)))
        << name << ": the tensor cores' logits are the CUDA cores' bits (the setting did nothing?)";
  }
}

TEST(CudaDecoderInvariant, TensorCoreProductsRefusedInFp32) {
  const jtok::Model m = test_model(tiny_qwen3());
  EXPECT_THROW(jtok::cuda::make_device_decoder(m, settings(false, true, true)), jtok::Error);
}

}  // namespace
