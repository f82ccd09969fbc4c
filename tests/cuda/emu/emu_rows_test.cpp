// Row kernels on the CPU through their real launchers (tests/cuda/emu):
// - row_invariant_linear against a double-accumulated product (the GPU test's twin, linear_forward,
//   needs oneDNN: not linked here), + bias + out, at the GPU test's tolerances (fp32 1e-6, bf16 5e-3,
//   bf16 in / fp32 out 1e-6), and its property: every row of an M-row product bit for bit the row
//   computed alone, from an aligned copy and from one element off 16-byte alignment
//   (tests/cuda/test_cuda_row_invariant.cpp's EachRowHasItsBitsAlone, on smaller shapes).
// - logit_digest against logit_digest_ref (what tests/cuda/emulate_logit_digest.sh checked with
//   shims of its own): argmax, max, list, draw exact; lse and sum_t within 1e-12 relative.
//   JTOK_EMU_DIGEST_V=151936 bash tests/cuda/emulate_kernels.sh --gtest_filter='*Digest*' for
//   Qwen3's vocabulary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>

#include "cuda/logit_digest.h"
#include "cuda/row_invariant_linear.h"
#include "cuda_case.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;
using bf16 = __nv_bfloat16;

struct Product {
  int64_t C, OC, M;
  std::vector<float> inp, weight, bias, out0;
};

Product make_product(int64_t C, int64_t OC, int64_t M, uint64_t seed) {
  return {C, OC, M, randn(M * C, seed), randn(OC * C, seed + 1, 0.1f), randn(OC, seed + 2), randn(M * OC, seed + 3)};
}

// out0 + inp weight^T + bias, in double, on the dtype's inputs.
std::vector<float> cpu_product(const Product& p, DType t) {
  const auto x = to_dtype(p.inp, t), w = to_dtype(p.weight, t), b = to_dtype(p.bias, t), o = to_dtype(p.out0, t);
  std::vector<float> out(static_cast<size_t>(p.M * p.OC));
  for (int64_t n = 0; n < p.M; ++n)
    for (int64_t j = 0; j < p.OC; ++j) {
      double s = 0;
      for (int64_t c = 0; c < p.C; ++c) s += static_cast<double>(x[n * p.C + c]) * w[j * p.C + c];
      out[n * p.OC + j] = static_cast<float>(s + b[j] + o[n * p.OC + j]);
    }
  return out;
}

// The launcher on `rows` rows of p starting at row r0, the inputs `offset` elements past an
// allocation's start (1: off 16-byte alignment, the element-by-element loads).
template <typename In, typename Out>
std::vector<float> gpu_product(const Product& p, int64_t r0, int64_t rows, int64_t offset = 0) {
  const DType t = sizeof(In) == 2 ? DType::bf16 : DType::f32;
  std::vector<float> x(offset, 0.f), o(offset, 0.f);
  x.insert(x.end(), p.inp.begin() + r0 * p.C, p.inp.begin() + (r0 + rows) * p.C);
  o.insert(o.end(), p.out0.begin() + r0 * p.OC, p.out0.begin() + (r0 + rows) * p.OC);
  auto dx = upload<In>(x), dw = upload<In>(p.weight);
  auto db = upload<Out>(to_dtype(p.bias, t)), dout = upload<Out>(to_dtype(o, t));
  jtok::cuda::row_invariant_linear<In, Out>(dout.get() + offset, dx.get() + offset, dw.get(), db.get(), rows, p.C,
                                            p.OC, true, nullptr);
  std::vector<float> out = download(dout);
  return {out.begin() + offset, out.end()};
}

TEST(EmulatedRowInvariant, MatchesDoubleProduct) {
  for (const auto& [C, OC] : {std::pair<int64_t, int64_t>{333, 70}, {1024, 24}}) {
    for (int64_t M : {1, 3, 16, 33}) {
      const Product p = make_product(C, OC, M, 60 + static_cast<uint64_t>(C + M));
      const std::string shape = "M " + std::to_string(M) + " C " + std::to_string(C) + " OC " + std::to_string(OC);
      CudaCase c{"row_invariant_linear", shape, {1e-6, 5e-3}};
      c.cpu = [&](DType t) { return Outputs{{"out", cpu_product(p, t)}}; };
      c.gpu = [&](DType t) {
        return t == DType::f32 ? Outputs{{"out", gpu_product<float, float>(p, 0, M)}}
                               : Outputs{{"out", gpu_product<bf16, bf16>(p, 0, M)}};
      };
      run_case(c);
      EXPECT_LE(jtok::testing::rel_err(gpu_product<bf16, float>(p, 0, M), cpu_product(p, DType::bf16)), 1e-6)
          << shape << " (bf16, fp32)";
    }
  }
}

template <typename In, typename Out>
void expect_rows_alone(const Product& p, int64_t offset) {
  const std::vector<float> together = gpu_product<In, Out>(p, 0, p.M);
  for (int64_t r = 0; r < p.M; ++r) {
    const std::vector<float> alone = gpu_product<In, Out>(p, r, 1, offset);
    ASSERT_EQ(0, std::memcmp(alone.data(), together.data() + r * p.OC, static_cast<size_t>(p.OC) * 4))
        << "row " << r << " of " << p.M << " (C " << p.C << ", OC " << p.OC << ", offset " << offset << ", "
        << sizeof(In) << "-byte in, " << sizeof(Out) << "-byte out) differs from itself alone";
  }
}

TEST(EmulatedRowInvariant, EachRowHasItsBitsAlone) {
  for (const auto& [C, OC] : {std::pair<int64_t, int64_t>{333, 10}, {1024, 8}}) {
    for (int64_t M : {2, 5, 16, 33}) {
      const Product p = make_product(C, OC, M, 90 + static_cast<uint64_t>(C + M));
      for (int64_t offset : {0, 1}) {
        expect_rows_alone<float, float>(p, offset);
        expect_rows_alone<bf16, bf16>(p, offset);
        expect_rows_alone<bf16, float>(p, offset);
      }
    }
  }
}

// Rows of a kind: 0 peaked with ties at the maximum, across rank 64 and at +-0; 1 flat; 2 all
// equal; 3 five finite logits among -1e30.
std::vector<float> digest_row(int kind, int64_t V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<float> l(V);
  std::normal_distribution<float> n(0.f, 3.f);
  std::uniform_real_distribution<float> u(0.f, 0.01f);
  std::uniform_int_distribution<int64_t> id(0, V - 1);
  for (float& x : l) x = kind == 0 ? n(g) : kind == 1 ? u(g) : kind == 2 ? 0.5f : -1e30f;
  if (kind == 3)
    for (int k = 0; k < 5; ++k) l[id(g)] = float(k);
  if (kind == 0) {
    std::vector<float> s = l;
    std::sort(s.begin(), s.end(), std::greater<float>());
    const float at = s[std::min<int64_t>(V - 1, 62)];
    for (int k = 0; k < 3; ++k) l[id(g)] = s[0] + 1.f;
    for (int k = 0; k < 8; ++k) l[id(g)] = at;
    l[id(g)] = -0.0f;
    l[id(g)] = 0.0f;
  }
  return l;
}

void expect_digests(int64_t V, int64_t M) {
  using jtok::cuda::DigestRow, jtok::cuda::LogitDigest;
  const int64_t ld = V + 7;
  std::vector<float> L(M * ld, 7.f);
  std::vector<DigestRow> R;
  std::mt19937_64 g(V);
  const double temps[] = {0.0, 0.7, 1.0, 1.5};
  for (int64_t i = 0; i < M; ++i) {
    const auto r = digest_row(i % 4, V, 100 * V + i);
    std::copy(r.begin(), r.end(), L.begin() + i * ld);
    R.push_back({temps[(i / 4) % 4], std::generate_canonical<double, 53>(g)});
  }
  auto dl = upload_exact(L);
  auto dr = upload_exact(R);
  DeviceBuffer<LogitDigest> dout(M);
  jtok::cuda::logit_digest(dout.get(), dl.get(), M, V, ld, dr.get(), nullptr);
  const std::vector<LogitDigest> out = download_exact(dout);
  for (int64_t i = 0; i < M; ++i) {
    SCOPED_TRACE("V " + std::to_string(V) + " row " + std::to_string(i) + " T " + std::to_string(R[i].temperature));
    const LogitDigest r = jtok::cuda::logit_digest_ref(L.data() + i * ld, V, R[i]);
    const LogitDigest& o = out[i];
    EXPECT_EQ(o.argmax, r.argmax);
    EXPECT_EQ(o.max, r.max);
    EXPECT_EQ(o.drawn, r.drawn);
    if (R[i].temperature > 0) {
      EXPECT_EQ(o.drawn_logit, r.drawn_logit);
    }
    EXPECT_NEAR(o.lse, r.lse, 1e-12 * std::max(1.0, std::fabs(r.lse)));
    EXPECT_NEAR(o.sum_t, r.sum_t, 1e-12 * r.sum_t);
    ASSERT_EQ(o.n_top, r.n_top);
    for (int k = 0; k < r.n_top; ++k) {
      ASSERT_EQ(o.top_id[k], r.top_id[k]) << "rank " << k;
      ASSERT_EQ(o.top_logit[k], r.top_logit[k]) << "rank " << k;
    }
  }
}

TEST(EmulatedLogitDigest, MatchesReference) {
  if (const char* v = std::getenv("JTOK_EMU_DIGEST_V")) return expect_digests(std::atoll(v), 16);
  for (int64_t V : {1, 2, 40, 63, 64, 65, 1000, 5003, 20000}) expect_digests(V, 16);
}

}  // namespace
