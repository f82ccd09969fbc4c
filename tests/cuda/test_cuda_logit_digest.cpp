// Sampling on the GPU (issue 40): the logit digest kernel (src/cuda/logit_digest.h) against its CPU
// twin logit_digest_ref on the same fp32 rows, and the GPU decoder's decode_pick against decode's
// logits picked on the host. Runs only on a GPU host (in test_cuda_ops).
//
// What must agree exactly: argmax and max, the list (ids and logits, the comparator's order: ties
// planted across the 64th rank and at the maximum), n_top, and drawn (the GPU's running sums differ
// from the reference's in the last bits, which moves the draw only when r falls within ~1e-16 of a
// boundary: not for these rows and draws). lse and sum_t: the same terms summed in another order,
// within 1e-12 relative. The kernel twice on the same rows: the same bytes (no atomics deciding bits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/decoder.h"
#include "cuda/logit_digest.h"
#include "cuda_case.h"
#include "infer/decoder.h"
#include "infer/token_pick.h"
#include "model_case.h"

namespace {

using namespace jtok::cuda_test;
using jtok::cuda::DigestRow;
using jtok::cuda::LogitDigest;

// A digest case: M rows of V logits at stride ld, each row's inputs.
struct DigestCase {
  std::string name;
  int64_t V = 0, ld = 0;
  std::vector<float> logits;  // (M, ld)
  std::vector<DigestRow> rows;
  int64_t M() const { return static_cast<int64_t>(rows.size()); }
};

// Row kinds: 0 peaked (normal, scale 3, ties planted at the top and across rank 64), 1 flat
// (within 0.01), 2 every logit equal, 3 five logits 0..4 and -1e30 elsewhere (exp underflows to 0).
std::vector<float> make_row(int kind, int64_t V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<float> l(static_cast<size_t>(V));
  std::normal_distribution<float> n(0.f, 3.f);
  std::uniform_real_distribution<float> u(0.f, 0.01f);
  std::uniform_int_distribution<int64_t> id(0, V - 1);
  for (float& x : l) x = kind == 0 ? n(g) : kind == 1 ? u(g) : kind == 2 ? 0.5f : -1e30f;
  if (kind == 3)
    for (int k = 0; k < 5; ++k) l[static_cast<size_t>(id(g))] = static_cast<float>(k);
  if (kind == 0) {
    std::vector<float> s = l;
    std::sort(s.begin(), s.end(), std::greater<float>());
    const float at = s[static_cast<size_t>(std::min<int64_t>(V - 1, 62))];
    for (int k = 0; k < 3; ++k) l[static_cast<size_t>(id(g))] = s[0] + 1.f;
    for (int k = 0; k < 8; ++k) l[static_cast<size_t>(id(g))] = at;
  }
  return l;
}

DigestCase make_case(const std::string& name, int64_t V, int64_t ld, int64_t M, uint64_t seed) {
  DigestCase c{name, V, ld, std::vector<float>(static_cast<size_t>(M * ld), 7.f), {}};
  const double temps[] = {0.0, 0.7, 1.0, 1.5};
  std::mt19937_64 g(seed);
  for (int64_t i = 0; i < M; ++i) {
    const std::vector<float> r = make_row(static_cast<int>(i % 4), V, seed + i);
    std::copy(r.begin(), r.end(), c.logits.begin() + i * ld);  // columns V..ld-1 stay 7: never read
    c.rows.push_back({temps[(i / 4) % 4], std::generate_canonical<double, 53>(g)});
  }
  return c;
}

std::vector<LogitDigest> device_digests(const DigestCase& c) {
  DeviceBuffer<float> l = upload<float>(c.logits);
  DeviceBuffer<DigestRow> rows = upload_exact(c.rows);
  DeviceBuffer<LogitDigest> out(static_cast<size_t>(c.M()));
  out.zero();  // the struct's tail padding: the same bytes in both runs
  jtok::cuda::logit_digest(out.get(), l.get(), c.M(), c.V, c.ld, rows.get(), nullptr);
  JTOK_CUDA_CHECK(cudaGetLastError());
  return download_exact(out);
}

void expect_digest(const std::string& at, const LogitDigest& g, const LogitDigest& r, double T) {
  EXPECT_EQ(g.argmax, r.argmax) << at;
  EXPECT_EQ(g.max, r.max) << at;
  ASSERT_EQ(g.n_top, r.n_top) << at;
  for (int k = 0; k < r.n_top; ++k) {
    EXPECT_EQ(g.top_id[k], r.top_id[k]) << at << " rank " << k;
    EXPECT_EQ(g.top_logit[k], r.top_logit[k]) << at << " rank " << k;
  }
  EXPECT_NEAR(g.lse, r.lse, 1e-12 * std::max(1.0, std::fabs(r.lse))) << at;
  EXPECT_NEAR(g.sum_t, r.sum_t, 1e-12 * r.sum_t) << at;
  EXPECT_EQ(g.drawn, r.drawn) << at;
  if (T > 0) {
    EXPECT_EQ(g.drawn_logit, r.drawn_logit) << at;
  }
}

void run_digest_case(const DigestCase& c) {
  const std::vector<LogitDigest> got = device_digests(c), again = device_digests(c);
  ASSERT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * sizeof(LogitDigest))) << c.name;
  for (int64_t i = 0; i < c.M(); ++i) {
    const LogitDigest ref = jtok::cuda::logit_digest_ref(c.logits.data() + i * c.ld, c.V, c.rows[i]);
    expect_digest(c.name + " row " + std::to_string(i), got[i], ref, c.rows[i].temperature);
  }
  std::printf("cuda case logit_digest %-24s V %lld, %lld rows: checked\n", c.name.c_str(),
              static_cast<long long>(c.V), static_cast<long long>(c.M()));
}

TEST(CudaOps, LogitDigestQwen3Vocabulary) { run_digest_case(make_case("qwen3 V", 151936, 151936, 16, 1)); }
TEST(CudaOps, LogitDigestPaddedStride) { run_digest_case(make_case("V 1000 ld 1024", 1000, 1024, 16, 2)); }
TEST(CudaOps, LogitDigestShortRows) {
  run_digest_case(make_case("V 40", 40, 48, 8, 3));  // fewer ids than the list holds
  run_digest_case(make_case("V 1", 1, 1, 4, 4));
}

// decode_pick on the GPU decoder against decode's logits picked on the host (pick_from_row: the CPU's
// sample_token and token_logprob) on a twin decoder: the same tokens, the RNGs in the same state,
// log-probs within 1e-6 (lse summed in another order). Greedy, top_k 5, top_p 0.9 (random weights
// give flat rows: the fallback's row copy), plain temperature, with top_logprobs 3.
void expect_picks_match(bool bf16) {
  const jtok::Model m = test_model(tiny_qwen3());
  const jtok::cuda::DecoderSettings s = decoder_settings(bf16);
  auto a = jtok::make_decoder(m, "cuda", s), b = jtok::make_decoder(m, "cuda", s);
  const std::vector<jtok::SamplingParams> params = {{0.0, 0, 1.0}, {0.8, 5, 1.0}, {1.0, 0, 0.9}, {1.0, 0, 1.0}};
  const int64_t M = 4, V = m.cfg.vocab_size;
  std::vector<int64_t> sa, sb;
  std::vector<std::mt19937_64> ra, rb;
  std::vector<jtok::PickRequest> qa, qb;
  std::vector<int32_t> tok;
  for (int64_t i = 0; i < M; ++i) {
    const std::vector<int32_t> p = skewed_ids(5 + 7 * i, V, 40 + i);
    sa.push_back(a->open(64));
    sb.push_back(b->open(64));
    a->prefill(sa.back(), p.data(), static_cast<int64_t>(p.size()));
    const std::vector<float> last = b->prefill(sb.back(), p.data(), static_cast<int64_t>(p.size()));
    tok.push_back(static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
    ra.emplace_back(100 + i), rb.emplace_back(100 + i);
  }
  for (int64_t i = 0; i < M; ++i) qa.push_back({params[i], &ra[i], 3}), qb.push_back({params[i], &rb[i], 3});
  std::vector<float> logits(static_cast<size_t>(M * V));
  for (int step = 0; step < 12; ++step) {
    std::vector<jtok::TokenPick> got(static_cast<size_t>(M));
    a->decode_pick(sa.data(), tok.data(), M, qa.data(), got.data());
    b->decode(sb.data(), tok.data(), M, logits.data());
    for (int64_t i = 0; i < M; ++i) {
      const std::string at = std::string(bf16 ? "bf16" : "fp32") + " step " + std::to_string(step) + " row " +
                             std::to_string(i);
      const jtok::TokenPick want = jtok::pick_from_row(logits.data() + i * V, V, qb[i]);
      ASSERT_EQ(got[i].token, want.token) << at;
      EXPECT_TRUE(ra[i] == rb[i]) << at;
      EXPECT_NEAR(got[i].logprob.logprob, want.logprob.logprob, 1e-6) << at;
      ASSERT_EQ(got[i].logprob.top.size(), want.logprob.top.size()) << at;
      for (size_t k = 0; k < want.logprob.top.size(); ++k)
        EXPECT_EQ(got[i].logprob.top[k].first, want.logprob.top[k].first) << at;
      tok[static_cast<size_t>(i)] = want.token;
    }
  }
}

TEST(CudaDecoder, DecodePickMatchesHostPicksFp32) { expect_picks_match(false); }
TEST(CudaDecoder, DecodePickMatchesHostPicksBf16) { expect_picks_match(true); }

}  // namespace
