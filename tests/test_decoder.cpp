// The CPU decoder (infer/decoder.h) gives the bits of infer/generate.h's free functions: a one-shot
// prefill, a prefill in pieces (prefill then prefill_chunk), a decode step of several sequences
// (decode_batch), a fork (a copy of the cache); handles are reused lowest first.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/device.h"
#include "infer/decoder.h"
#include "infer/generate_run.h"
#include "model_test_util.h"

using namespace jtok;
using namespace jtok::testing;

namespace {

Model test_model() {
  TinyJtokShape s;
  s.layers = 3;
  s.jtok_layers = "0,2";
  s.jtokm_layers = "1-2";
  return make_model(tiny_jtok_config(s), 5);
}

std::vector<int32_t> prompt_of(int64_t n, int64_t V, int64_t salt) {
  std::vector<int32_t> p;
  for (int64_t j = 0; j < n; ++j) p.push_back(static_cast<int32_t>((salt * 31 + j * 17 + 3) % V));
  return p;
}

// Whether a and b hold the same floats bit for bit.
bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && same_bits(a.data(), b.data(), a.size());
}
bool same_cache(const KVCache& a, const KVCache& b) {
  return a.len == b.len && a.capacity == b.capacity && a.bf16 == b.bf16 && a.k == b.k && a.v == b.v &&
         a.k16 == b.k16 && a.v16 == b.v16;
}

// Every position's logits handed to `each`, in order.
PositionLogits collect(std::vector<float>& out, int64_t V) {
  return [&out, V](int64_t pos, int64_t n, const float* l) {
    out.resize(static_cast<size_t>((pos + n) * V));
    std::memcpy(out.data() + pos * V, l, static_cast<size_t>(n * V) * sizeof(float));
  };
}

}  // namespace

TEST(Decoder, CpuPrefillIsPrefill) {
  const Model m = test_model();
  const int64_t V = m.cfg.vocab_size;
  for (bool bf16 : {false, true}) {
    const std::vector<int32_t> p = prompt_of(9, V, 1);
    KVCache want;
    want.bf16 = bf16;
    std::vector<float> want_each, got_each;
    const std::vector<float> want_l = prefill(m, want, p, 30, collect(want_each, V));
    auto d = make_cpu_decoder(m, bf16);
    EXPECT_EQ(d->describe(), "cpu");
    const int64_t s = d->open(30);
    ASSERT_NE(d->host_cache(s), nullptr);
    EXPECT_EQ(d->length(s), 0);
    EXPECT_EQ(d->capacity(s), 30);
    const std::vector<float> got_l = d->prefill(s, p.data(), 9, collect(got_each, V));
    EXPECT_TRUE(same_bits(want_l, got_l)) << "bf16 " << bf16;
    EXPECT_TRUE(same_bits(want_each, got_each)) << "bf16 " << bf16;
    EXPECT_EQ(want_each.size(), static_cast<size_t>(9 * V));
    EXPECT_EQ(d->length(s), 9);
    EXPECT_TRUE(same_cache(want, *d->host_cache(s))) << "bf16 " << bf16;
  }
}

TEST(Decoder, CpuPrefillInPiecesIsPrefillThenChunks) {
  const Model m = test_model();
  const int64_t V = m.cfg.vocab_size;
  const std::vector<int32_t> p = prompt_of(17, V, 2);
  KVCache want;
  prefill(m, want, {p.begin(), p.begin() + 5}, 40);
  prefill_chunk(m, want, p.data() + 5, 7);
  std::vector<float> want_each;
  const std::vector<float> want_l = prefill_chunk(m, want, p.data() + 12, 5, nullptr, collect(want_each, V));
  auto d = make_cpu_decoder(m, false);
  const int64_t s = d->open(40);
  d->prefill(s, p.data(), 5);
  d->prefill(s, p.data() + 5, 7);
  std::vector<float> got_each;
  const std::vector<float> got_l = d->prefill(s, p.data() + 12, 5, collect(got_each, V));
  EXPECT_TRUE(same_bits(want_l, got_l));
  EXPECT_TRUE(same_bits(want_each, got_each));  // positions 12..16, at the same offsets
  EXPECT_EQ(d->length(s), 17);
  EXPECT_TRUE(same_cache(want, *d->host_cache(s)));
}

// Three sequences at different positions decoded together twice: decode_batch's logits and rows.
TEST(Decoder, CpuDecodeIsDecodeBatch) {
  const Model m = test_model();
  const int64_t V = m.cfg.vocab_size, M = 3;
  auto d = make_cpu_decoder(m, false);
  std::vector<KVCache> want(M);
  std::vector<int64_t> seqs;
  for (int64_t i = 0; i < M; ++i) {
    const std::vector<int32_t> p = prompt_of(3 + 4 * i, V, 10 + i);
    prefill(m, want[i], p, 24);
    seqs.push_back(d->open(24));
    d->prefill(seqs.back(), p.data(), static_cast<int64_t>(p.size()));
  }
  std::vector<KVCache*> ptrs{&want[0], &want[1], &want[2]};
  for (int step = 0; step < 2; ++step) {
    const std::vector<int32_t> tokens = {7, static_cast<int32_t>(11 + step), 7};  // an id repeats in the step
    std::vector<float> want_l(M * V), got_l(M * V);
    const int64_t want_rows = decode_batch(m, ptrs.data(), tokens.data(), M, want_l.data());
    const int64_t got_rows = d->decode(seqs.data(), tokens.data(), M, got_l.data());
    EXPECT_GT(want_rows, 0);
    EXPECT_EQ(want_rows, got_rows) << "step " << step;
    EXPECT_TRUE(same_bits(want_l, got_l)) << "step " << step;
    for (int64_t i = 0; i < M; ++i) EXPECT_TRUE(same_cache(want[i], *d->host_cache(seqs[i]))) << "sequence " << i;
  }
  EXPECT_EQ(d->length(seqs[2]), 11 + 2);
}

// A fork is a copy: it and its source then decode on their own, each as a KVCache copy would; a fork
// with more room holds the same positions.
TEST(Decoder, CpuForkCopiesTheCache) {
  const Model m = test_model();
  const int64_t V = m.cfg.vocab_size;
  const std::vector<int32_t> p = prompt_of(6, V, 3);
  for (bool bf16 : {false, true}) {
    auto d = make_cpu_decoder(m, bf16);
    const int64_t a = d->open(12);
    d->prefill(a, p.data(), 6);
    const int64_t b = d->fork(a, 12), c = d->fork(a, 20);
    EXPECT_NE(a, b);
    EXPECT_NE(b, c);
    EXPECT_EQ(d->length(c), 6);
    EXPECT_EQ(d->capacity(c), 20);
    EXPECT_TRUE(same_cache(*d->host_cache(a), *d->host_cache(b)));
    KVCache ca = *d->host_cache(a), cb = ca;
    const std::vector<float> want_a = decode_step(m, ca, 5), want_b = decode_step(m, cb, 9);
    const int64_t seqs[3] = {a, b, c};
    const int32_t tokens[3] = {5, 9, 9};
    std::vector<float> got(3 * V);
    d->decode(seqs, tokens, 3, got.data());
    EXPECT_TRUE(same_bits(want_a.data(), got.data(), V)) << "bf16 " << bf16;
    EXPECT_TRUE(same_bits(want_b.data(), got.data() + V, V)) << "bf16 " << bf16;
    EXPECT_TRUE(same_bits(want_b.data(), got.data() + 2 * V, V)) << "bf16 " << bf16 << ": the larger fork";
    EXPECT_TRUE(same_cache(ca, *d->host_cache(a)));
    EXPECT_TRUE(same_cache(cb, *d->host_cache(b)));
    // The larger fork runs on past the source's capacity: 13 more positions (7 .. 19).
    for (int32_t t = 0; t < 13; ++t) d->decode(&c, &t, 1, got.data());
    EXPECT_EQ(d->length(c), 20);
    EXPECT_THROW(d->decode(&c, tokens, 1, got.data()), Error);  // full
  }
}

TEST(Decoder, CpuHandlesReusedLowestFirst) {
  const Model m = test_model();
  auto d = make_cpu_decoder(m, false);
  EXPECT_EQ(d->open(8), 0);
  EXPECT_EQ(d->open(8), 1);
  EXPECT_EQ(d->open(8), 2);
  d->close(1);
  d->close(0);
  EXPECT_THROW(d->length(1), Error);
  EXPECT_THROW(d->close(7), Error);
  EXPECT_EQ(d->open(4), 0);
  EXPECT_EQ(d->capacity(0), 4);
  EXPECT_EQ(d->length(0), 0);  // a fresh sequence, not the closed one's cache
  EXPECT_EQ(d->open(8), 1);
  EXPECT_EQ(d->open(8), 3);
  const int32_t t[2] = {1, 2};
  const std::vector<int32_t> five = prompt_of(5, m.cfg.vocab_size, 4);
  EXPECT_THROW(d->prefill(0, five.data(), 5), Error);  // beyond its 4 positions
  d->prefill(0, t, 2);
  EXPECT_EQ(d->length(0), 2);
}

TEST(Decoder, MakeDecoderNamesTheDevice) {
  const Model m = test_model();
  cuda::DecoderSettings s;
  s.kv_bf16 = true;
  auto d = make_decoder(m, "cpu", s);
  EXPECT_EQ(d->describe(), "cpu");
  const int64_t h = d->open(8);
  const int32_t t = 3;
  d->prefill(h, &t, 1);
  EXPECT_TRUE(d->host_cache(h)->bf16);  // settings.kv_bf16
  try {
    make_decoder(m, "tpu", s);
    ADD_FAILURE() << "device tpu accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tpu"), std::string::npos) << e.what();
  }
  // cuda: without CUDA built in, the build's reason; with it, a decoder or an error saying why not.
  try {
    auto g = make_decoder(m, "cuda", s);
    EXPECT_TRUE(cuda::built_with_cuda()) << "a build without CUDA made a cuda decoder";
    EXPECT_FALSE(g->describe().empty());
    EXPECT_EQ(g->host_cache(0), nullptr);
  } catch (const Error& e) {  // with CUDA: no GPU, or what the GPU decoder refuses, named
    if (!cuda::built_with_cuda()) {
      EXPECT_EQ(std::string(e.what()).rfind("--device cuda: this jtok was built without CUDA", 0), 0u) << e.what();
    }
    EXPECT_FALSE(std::string(e.what()).empty());
  }
}

// generate_tokens on a Decoder: the Model overload's tokens (bf16 KV too); its sequence closed after
// (the handle free again); the prompt's log-probs from the prefill those of one forward.
TEST(Decoder, GenerateTokensOnADecoder) {
  const Model m = test_model();
  const std::vector<int32_t> prompt = prompt_of(7, m.cfg.vocab_size, 6);
  GenerateOptions opt;
  opt.max_new_tokens = 10;
  opt.sampling = SamplingParams{0.9, 20, 0.95};
  opt.seed = 3;
  opt.kv_bf16 = true;
  const auto ignore = [](int32_t) {};
  const GenerateResult want = generate_tokens(m, prompt, 30, opt, ignore);
  auto d = make_cpu_decoder(m, true);
  opt.prompt_logprobs = true;
  for (int run = 0; run < 2; ++run) {
    const GenerateResult got = generate_tokens(m, *d, prompt, 30, opt, ignore);
    EXPECT_EQ(got.generated, want.generated) << "run " << run;
    EXPECT_EQ(got.top2_margins, want.top2_margins) << "run " << run;
    const std::vector<float> lp = prompt_logprobs(m, prompt);
    ASSERT_EQ(got.prompt_logprobs.size(), lp.size());
    for (size_t t = 0; t < lp.size(); ++t) EXPECT_NEAR(got.prompt_logprobs[t], lp[t], 1e-5) << "position " << t + 1;
  }
  EXPECT_TRUE(want.prompt_logprobs.empty());
  EXPECT_EQ(d->open(4), 0);  // generate_tokens closed its sequences
}
