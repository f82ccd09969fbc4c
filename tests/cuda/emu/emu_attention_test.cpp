// attention.cu's scalar-tile flash attention on the CPU through its launchers (tests/cuda/emu),
// forward (out, lse) and backward (dq, dk, dv accumulated onto nonzero starts), against a
// double-precision causal grouped-query attention written out below (the GPU test's twin,
// ops/attention.cpp, multiplies by oneDNN: not linked here). Tolerances as
// tests/cuda/test_cuda_attention.cpp's: fp32 1e-5, bf16 2e-2. The bf16 tensor-core path
// (attention_mma*.cu, inline PTX) is not emulated.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cuda/attention.h"
#include "cuda_case.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

struct Shape {
  int64_t B, T, H, KV, hd;
};

struct Inputs {
  std::vector<float> q, k, v, dout, dq0, dk0, dv0;
};

// q (B,T,H,hd), k v (B,T,KV,hd); head h reads kv head h / (H / KV); row t sees keys j <= t.
Outputs reference(const Shape& s, const Inputs& raw, DType t) {
  const auto [B, T, H, KV, hd] = s;
  const auto q = to_dtype(raw.q, t), k = to_dtype(raw.k, t), v = to_dtype(raw.v, t), dO = to_dtype(raw.dout, t);
  const auto dq0 = to_dtype(raw.dq0, t), dk0 = to_dtype(raw.dk0, t), dv0 = to_dtype(raw.dv0, t);
  std::vector<double> out(q.size()), lse(B * H * T), dq(dq0.begin(), dq0.end()), dk(dk0.begin(), dk0.end()),
      dv(dv0.begin(), dv0.end());
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  auto Q = [&](int64_t b, int64_t i, int64_t h) { return (b * T + i) * H * hd + h * hd; };
  auto K = [&](int64_t b, int64_t j, int64_t g) { return (b * T + j) * KV * hd + g * hd; };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t g = h / (H / KV);
        std::vector<double> p(i + 1);
        double mx = -INFINITY, sum = 0, D = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < hd; ++e) d += static_cast<double>(q[Q(b, i, h) + e]) * k[K(b, j, g) + e];
          p[j] = d * scale, mx = std::max(mx, p[j]);
        }
        for (double& x : p) sum += std::exp(x - mx);
        lse[(b * H + h) * T + i] = mx + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) p[j] = std::exp(p[j] - lse[(b * H + h) * T + i]);
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < hd; ++e) out[Q(b, i, h) + e] += p[j] * v[K(b, j, g) + e];
        for (int64_t e = 0; e < hd; ++e) D += dO[Q(b, i, h) + e] * out[Q(b, i, h) + e];
        for (int64_t j = 0; j <= i; ++j) {
          double dp = 0;
          for (int64_t e = 0; e < hd; ++e) dp += static_cast<double>(dO[Q(b, i, h) + e]) * v[K(b, j, g) + e];
          const double ds = p[j] * (dp - D);
          for (int64_t e = 0; e < hd; ++e) {
            dq[Q(b, i, h) + e] += scale * ds * k[K(b, j, g) + e];
            dk[K(b, j, g) + e] += scale * ds * q[Q(b, i, h) + e];
            dv[K(b, j, g) + e] += p[j] * dO[Q(b, i, h) + e];
          }
        }
      }
  auto f = [](const std::vector<double>& d) { return std::vector<float>(d.begin(), d.end()); };
  return {{"out", f(out)}, {"lse", f(lse)}, {"dq", f(dq)}, {"dk", f(dk)}, {"dv", f(dv)}};
}

template <typename E>
Outputs emulated(const Shape& s, const Inputs& in, bool tiles) {
  const auto [B, T, H, KV, hd] = s;
  auto q = upload<E>(in.q), k = upload<E>(in.k), v = upload<E>(in.v), dout = upload<E>(in.dout);
  auto dq = upload<E>(in.dq0), dk = upload<E>(in.dk0), dv = upload<E>(in.dv0);
  DeviceBuffer<E> out(in.q.size());
  DeviceBuffer<float> lse(B * H * T), row_terms(B * H * T);
  JTOK_CUDA_CHECK(cudaMemset(out.get(), 0xff, out.n * sizeof(E)));  // NaN: every entry must be written
  JTOK_CUDA_CHECK(cudaMemset(lse.get(), 0xff, lse.n * sizeof(float)));
  if (tiles) {
    jtok::cuda::attention_forward_tiles<E>(out.get(), lse.get(), q.get(), k.get(), v.get(), B, T, H, KV, hd, nullptr);
    jtok::cuda::attention_backward_tiles<E>(dq.get(), dk.get(), dv.get(), row_terms.get(), dout.get(), out.get(),
                                            lse.get(), q.get(), k.get(), v.get(), B, T, H, KV, hd, nullptr);
  } else {
    jtok::cuda::attention_forward<E>(out.get(), lse.get(), q.get(), k.get(), v.get(), B, T, H, KV, hd, nullptr);
    jtok::cuda::attention_backward<E>(dq.get(), dk.get(), dv.get(), row_terms.get(), dout.get(), out.get(), lse.get(),
                                      q.get(), k.get(), v.get(), B, T, H, KV, hd, nullptr);
  }
  return {{"out", download(out)}, {"lse", download(lse)}, {"dq", download(dq)}, {"dk", download(dk)},
          {"dv", download(dv)}};
}

TEST(EmulatedAttention, TilesMatchDoubleReference) {
  for (const Shape s : {Shape{2, 33, 4, 2, 32}, Shape{1, 1, 2, 1, 64}, Shape{1, 40, 2, 2, 128}}) {
    const uint64_t seed = 100 + static_cast<uint64_t>(s.T * 7 + s.KV * 3 + s.hd);
    const size_t nq = s.B * s.T * s.H * s.hd, nkv = s.B * s.T * s.KV * s.hd;
    const Inputs in{randn(nq, seed), randn(nkv, seed + 1), randn(nkv, seed + 2), randn(nq, seed + 3),
                    randn(nq, seed + 4, 0.5f), randn(nkv, seed + 5, 0.5f), randn(nkv, seed + 6, 0.5f)};
    const std::string shape = "B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " H " + std::to_string(s.H) +
                              " KV " + std::to_string(s.KV) + " hd " + std::to_string(s.hd);
    CudaCase c{"attention tiles", shape, {1e-5, 2e-2}};
    c.cpu = [&](DType t) { return reference(s, in, t); };
    c.gpu = [&](DType t) { return by_dtype(t, [&]<typename E>(E) { return emulated<E>(s, in, true); }); };
    run_case(c);
    // fp32 through the dispatching launchers (fp32 takes the same tiles).
    const Outputs a = emulated<float>(s, in, false), b = emulated<float>(s, in, true);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].second, b[i].second) << a[i].first;
  }
}

}  // namespace
