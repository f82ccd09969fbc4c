// CUDA kernels against the CPU engine's own ops (tests/cuda/cuda_case.h), forward and backward,
// fp32 and bf16: the dense ops here, the token-table ops in test_cuda_dedup.cpp,
// test_cuda_embedding.cpp, test_cuda_jtok.cpp, test_cuda_jtokm.cpp, test_cuda_table_rows.cpp and
// test_cuda_table_adamw.cpp (one executable).
// Runs on a GPU host (registered with label cuda when CMake found a GPU; bash scripts/test_cuda.sh),
// compiled and linked everywhere the toolkit is; also compiled unchanged by
// tests/cuda/emulate_kernels.sh (no GPU). The device probe: test_cuda_device.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "cuda/adamw.h"
#include "cuda/cross_entropy.h"
#include "cuda/gemm_ref.h"
#include "cuda/global_norm.h"
#include "cuda/model_kernels.h"
#include "cuda/rmsnorm.h"
#include "cuda/rope.h"
#include "cuda/stats.h"
#include "cuda/swiglu.h"
#include "cuda_case.h"
#include "ops/adamw.h"
#include "ops/cross_entropy.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;
using bf16 = __nv_bfloat16;

// RMSNorm forward (out, rstd) and backward (dinp accumulated onto a nonzero start, dweight likewise)
// of N rows of C; fp32 tolerance tol32 (dweight is a sum over the N rows, in another order than the CPU's).
void rmsnorm_case(int64_t N, int64_t C, double tol32) {
  const float eps = 1e-5f;
  const auto x = randn(N * C, 1), w = randn(C, 2, 0.5f), dy = randn(N * C, 3), dx0 = randn(N * C, 4, 0.1f),
             dw0 = randn(C, 5, 0.1f);
  CudaCase c{"rmsnorm", "N " + std::to_string(N) + ", C " + std::to_string(C), {tol32, 1e-2}};
  c.cpu = [&](DType t) {
    const auto xt = to_dtype(x, t), wt = to_dtype(w, t), dyt = to_dtype(dy, t);
    std::vector<float> out(N * C), rstd(N), dx = to_dtype(dx0, t), dw = dw0;
    jtok::rmsnorm_forward(out.data(), rstd.data(), xt.data(), wt.data(), N, C, eps);
    jtok::rmsnorm_backward(dx.data(), dw.data(), dyt.data(), xt.data(), wt.data(), rstd.data(), N, C);
    return Outputs{{"out", out}, {"rstd", rstd}, {"dinp", dx}, {"dweight", dw}};
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename T>(T) {
      auto dx_ = upload<T>(x), dw_ = upload<T>(w), ddy = upload<T>(dy), ddx = upload<T>(dx0);
      DeviceBuffer<T> out(N * C);
      DeviceBuffer<float> rstd(N), scratch(jtok::cuda::rmsnorm_backward_scratch(N, C));
      auto ddw = upload<float>(dw0);
      jtok::cuda::rmsnorm_forward(out.get(), rstd.get(), dx_.get(), dw_.get(), N, C, eps, nullptr);
      jtok::cuda::rmsnorm_backward(ddx.get(), ddw.get(), scratch.get(), ddy.get(), dx_.get(), dw_.get(), rstd.get(), N,
                                   C, nullptr);
      return Outputs{{"out", download(out)}, {"rstd", download(rstd)}, {"dinp", download(ddx)},
                     {"dweight", download(ddw)}};
    });
  };
  run_case(c);
  expect_deterministic(c, DType::bf16);
}

// C not a multiple of 32 or of the block. 37 rows: a backward block a row; 2,600: 6 rows a block
// of 512, summed 4 rows at a time, then 2 (the rows past a block's end read, never written); its
// dweight sums 2,600 rows (fp32 error 1.1e-6 on the emulated GPU).
TEST(CudaOps, Rmsnorm) {
  rmsnorm_case(37, 200, 2e-6);
  rmsnorm_case(2600, 200, 5e-6);
}

// RMSNorm over heads inside wider rows (qk_norm's q or k inside a q | k | v row: NormRows) and the
// backward in place: the CPU op on the heads packed, put back into the rows; the columns outside the
// heads must come back untouched (out starts as a pattern, dx as dy). N rows of H heads of C.
void rmsnorm_heads_case(int64_t N, int64_t H, int64_t C, double tol32) {
  const int64_t S = 5 * C + 8, off = 24;  // heads at [off, off + H C) of each row
  const float eps = 1e-6f;
  const auto x = randn(N * S, 6), w = randn(C, 7, 0.5f), dy = randn(N * S, 8), pattern = randn(N * S, 9);
  CudaCase c{"rmsnorm_heads",
             "N " + std::to_string(N) + ", H " + std::to_string(H) + ", C " + std::to_string(C) + ", stride " +
                 std::to_string(S) + ", in place",
             {tol32, 1e-2}};
  const auto at = [&](int64_t r, int64_t j) { return r / H * S + off + r % H * C + j; };  // head row r's j
  c.cpu = [&](DType t) {
    const auto xt = to_dtype(x, t), wt = to_dtype(w, t), dyt = to_dtype(dy, t);
    std::vector<float> xs(N * H * C), dys(xs.size()), out_s(xs.size()), dx_s(xs.size()), rstd(N * H), dw(C);
    for (int64_t r = 0; r < N * H; ++r)
      for (int64_t j = 0; j < C; ++j) xs[r * C + j] = xt[at(r, j)], dys[r * C + j] = dyt[at(r, j)];
    jtok::rmsnorm_forward(out_s.data(), rstd.data(), xs.data(), wt.data(), N * H, C, eps);
    jtok::rmsnorm_backward(dx_s.data(), dw.data(), dys.data(), xs.data(), wt.data(), rstd.data(), N * H, C);
    std::vector<float> out = to_dtype(pattern, t), dx = dyt;
    for (int64_t r = 0; r < N * H; ++r)
      for (int64_t j = 0; j < C; ++j) out[at(r, j)] = out_s[r * C + j], dx[at(r, j)] = dx_s[r * C + j];
    return Outputs{{"out", out}, {"rstd", rstd}, {"dx", dx}, {"dweight", dw}};
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename T>(T) {
      auto dev_x = upload<T>(x), dev_w = upload<T>(w), dev_dx = upload<T>(dy), dev_out = upload<T>(pattern);
      DeviceBuffer<float> rstd(N * H), scratch(jtok::cuda::rmsnorm_backward_scratch(N * H, C)), ddw(C);
      ddw.zero();
      const jtok::cuda::NormRows rows{H, S};
      jtok::cuda::rmsnorm_forward(dev_out.get() + off, rstd.get(), dev_x.get() + off, dev_w.get(), N * H, C, eps,
                                  nullptr, rows);
      jtok::cuda::rmsnorm_backward_in_place(dev_dx.get() + off, ddw.get(), scratch.get(), dev_x.get() + off,
                                            dev_w.get(), rstd.get(), N * H, C, nullptr, rows);
      return Outputs{
          {"out", download(dev_out)}, {"rstd", download(rstd)}, {"dx", download(dev_dx)}, {"dweight", download(ddw)}};
    });
  };
  run_case(c);
  expect_deterministic(c, DType::bf16);
}

// 39 head rows: a backward block each; 2,100: 5 a block, 4 at a time then 1, in place (dweight
// over 2,100 rows: fp32 error 9.6e-7 on the emulated GPU).
TEST(CudaOps, RmsnormHeadsInPlace) {
  rmsnorm_heads_case(13, 3, 40, 2e-6);
  rmsnorm_heads_case(700, 3, 40, 5e-6);
}

// SwiGLU forward and backward on gate / up read from a fused (N, 2F) row (ld 2F), against the CPU op
// on separate arrays.
TEST(CudaOps, Swiglu) {
  const int64_t N = 19, F = 72, ld = 2 * F;
  const auto gu = randn(N * ld, 11, 2.0f), dy = randn(N * F, 12);
  CudaCase c{"swiglu", "N 19, F 72, ld 144", {1e-6, 1e-2}};
  c.cpu = [&](DType t) {
    const auto gut = to_dtype(gu, t), dyt = to_dtype(dy, t);
    std::vector<float> g(N * F), u(N * F), out(N * F), dg(N * F), du(N * F);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t f = 0; f < F; ++f) g[n * F + f] = gut[n * ld + f], u[n * F + f] = gut[n * ld + F + f];
    jtok::swiglu_forward(out.data(), g.data(), u.data(), N * F);
    jtok::swiglu_backward(dg.data(), du.data(), dyt.data(), g.data(), u.data(), N * F);
    std::vector<float> dgu(N * ld);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t f = 0; f < F; ++f) dgu[n * ld + f] = dg[n * F + f], dgu[n * ld + F + f] = du[n * F + f];
    return Outputs{{"out", out}, {"dgate|dup", dgu}};
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename T>(T) {
      auto dgu = upload<T>(gu), ddy = upload<T>(dy);
      DeviceBuffer<T> out(N * F), dd(N * ld);
      jtok::cuda::swiglu_forward(out.get(), dgu.get(), dgu.get() + F, N, F, ld, nullptr);
      jtok::cuda::swiglu_backward(dd.get(), dd.get() + F, ddy.get(), dgu.get(), dgu.get() + F, N, F, ld, nullptr);
      return Outputs{{"out", download(out)}, {"dgate|dup", download(dd)}};
    });
  };
  run_case(c);
}

// RoPE on q inside a fused qkv row (stride > H*hd; the k and v parts must come back untouched),
// forward at pos0 = 0 and backward, with the CPU's own cos / sin table.
TEST(CudaOps, Rope) {
  const int64_t B = 2, T = 7, H = 3, hd = 16, stride = 5 * hd;  // q (3 heads) then 2 more heads untouched
  const jtok::RopeTable tab = jtok::make_rope_table(T, hd, 10000.0);
  const auto x = randn(B * T * stride, 21), dy = randn(B * T * stride, 22);
  CudaCase c{"rope", "B 2, T 7, H 3, hd 16, stride 80", {1e-6, 1e-2}};
  c.cpu = [&](DType t) {
    auto xt = to_dtype(x, t), dyt = to_dtype(dy, t);
    std::vector<float> q(B * T * H * hd), dq(q.size());
    for (int64_t bt = 0; bt < B * T; ++bt)
      for (int64_t j = 0; j < H * hd; ++j) q[bt * H * hd + j] = xt[bt * stride + j], dq[bt * H * hd + j] = dyt[bt * stride + j];
    jtok::rope_forward(q.data(), tab, B, T, H, hd);
    jtok::rope_backward(dq.data(), tab, B, T, H, hd);
    for (int64_t bt = 0; bt < B * T; ++bt)
      for (int64_t j = 0; j < H * hd; ++j) xt[bt * stride + j] = q[bt * H * hd + j], dyt[bt * stride + j] = dq[bt * H * hd + j];
    return Outputs{{"x", xt}, {"dx", dyt}};
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename T_>(T_) {
      auto dx_ = upload<T_>(x), ddy = upload<T_>(dy);
      auto dcos = upload<float>(tab.cos), dsin = upload<float>(tab.sin);
      jtok::cuda::rope_forward(dx_.get(), dcos.get(), dsin.get(), B, T, H, hd, stride, 0, nullptr);
      jtok::cuda::rope_backward(ddy.get(), dcos.get(), dsin.get(), B, T, H, hd, stride, nullptr);
      return Outputs{{"x", download(dx_)}, {"dx", download(ddy)}};
    });
  };
  run_case(c);
}

// AdamW over a flat buffer of three tensors in one launch a step: A (5000, weight decay; given as two
// ranges that adamw_segments merges), B (77, frozen: in no segment, never touched), C (4096, plain:
// no decay). Three steps with a gradient (the clip coefficient read on the device), then one without
// (a zero gradient: the decays only), against the CPU's fused update tensor by tensor; the bf16 copy
// equals the GPU's own p rounded (expect_bf16_copy: the CPU's p may differ in its last bit) where
// stepped, and B's copy is left as it was.
TEST(CudaOps, Adamw) {
  const int64_t na = 5000, nb = 77, nc = 4096, n = na + nb + nc;
  const auto p0 = randn(n, 31, 0.02f), g = randn(n, 32, 0.5f);
  std::vector<float> m0(n), v0(n);
  const float clip = 0.7f;
  auto hyper = [](int64_t step, float wd) { return jtok::AdamWHyper{3e-3f, 0.9f, 0.95f, 1e-8f, wd, step, 0.7f}; };
  int64_t blocks = 0;
  const std::vector<jtok::cuda::AdamWSegment> segs =
      jtok::cuda::adamw_segments({{0, 2500, 0, 0}, {2500, 2500, 0, 0}, {na + nb, nc, 0, 1}}, blocks);
  ASSERT_EQ(segs.size(), 2u);  // A's two ranges merged
  EXPECT_EQ(blocks, (na + 255) / 256 + (nc + 255) / 256);
  EXPECT_EQ(segs[1].first_block, (na + 255) / 256);
  CudaCase c{"adamw", "A 5000 + B 77 frozen + C 4096 plain, 3 steps + 1 without grad", {1e-6, 1e-6}};
  c.cpu = [&](DType t) {
    const auto gt = to_dtype(g, t);
    std::vector<float> p = p0, m = m0, v = v0;
    for (const auto& [at, len, wd] : {std::tuple{int64_t{0}, na, 0.1f}, std::tuple{na + nb, nc, 0.0f}}) {
      for (int64_t k = 1; k <= 3; ++k)
        jtok::adamw_update(p.data() + at, gt.data() + at, m.data() + at, v.data() + at, len, hyper(k, wd));
      jtok::adamw_elements(p.data() + at, nullptr, m.data() + at, v.data() + at, len, jtok::adamw_consts(hyper(4, wd)));
    }
    return Outputs{{"p", p}, {"m", m}, {"v", v}};
  };
  auto consts = [&](int64_t k, float wd) {
    const jtok::AdamWStepConsts h = jtok::adamw_consts(hyper(k, wd));
    return jtok::cuda::AdamWConsts{h.b1, h.b2, h.eps, h.step_size, h.inv_sqrt_bc2, h.decay};
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename G>(G) {
      auto dp = upload<float>(p0), dm = upload<float>(m0), dv = upload<float>(v0), dscale = upload<float>({clip});
      auto dg = upload<G>(g);
      auto dsegs = upload_exact(segs);
      DeviceBuffer<bf16> pb(n);
      JTOK_CUDA_CHECK(cudaMemset(pb.get(), 0x7f, n * sizeof(bf16)));
      for (int64_t k = 1; k <= 4; ++k) {
        const jtok::cuda::AdamWKinds kinds{{consts(k, 0.1f), consts(k, 0.0f), consts(k, 0.1f), consts(k, 0.0f)}};
        jtok::cuda::adamw_update<G>(dp.get(), pb.get(), k <= 3 ? dg.get() : nullptr, dm.get(), dv.get(), dsegs.get(),
                                    static_cast<int64_t>(segs.size()), blocks, kinds, dscale.get(), nullptr);
      }
      const std::vector<float> p = download(dp), copy = download(pb);
      for (const auto& [at, len] : {std::pair{int64_t{0}, na}, std::pair{na + nb, nc}})
        expect_bf16_copy({copy.begin() + at, copy.begin() + at + len}, {p.begin() + at, p.begin() + at + len});
      int64_t frozen_written = 0;
      for (int64_t i = na; i < na + nb; ++i) frozen_written += f32_to_bf16_bits(copy[i]) != 0x7f7fu;
      EXPECT_EQ(frozen_written, 0) << "elements of frozen B's copy written";
      return Outputs{{"p", p}, {"m", download(dm)}, {"v", download(dv)}};
    });
  };
  run_case(c);
  expect_deterministic(c, DType::f32);
}

// Global norm over three tensors (a chunk and a bit, one whole chunk, a short one) and the clip
// coefficient, against the CPU's arithmetic (grad_global_norm: fp32 per 4096 chunk, double over
// chunks; coef in fp32 as clip_grad_norm_). Tolerance 1e-5: the CPU adds a chunk's 4096 squares one
// after another into one fp32 sum, the GPU by a tree; a host emulation of both orders over 200 input
// seeds puts the norm's error at up to 7e-7 in fp32 and 1.7e-6 to 2.2e-6 in bf16 (the squares of
// bf16 values round the same way often: the sequential sum drifts), past the 1e-6 this had.
TEST(CudaOps, GlobalNorm) {
  const std::vector<int64_t> sizes = {5000, 4096, 77};
  std::vector<std::vector<float>> gs;
  for (size_t k = 0; k < sizes.size(); ++k) gs.push_back(randn(sizes[k], 41 + k));
  CudaCase c{"global_norm", "n 5000 + 4096 + 77", {1e-5, 1e-5}};
  c.cpu = [&](DType t) {
    double ss = 0;
    for (const auto& g0 : gs) {
      const auto g = to_dtype(g0, t);
      for (size_t lo = 0; lo < g.size(); lo += 4096) {
        float s = 0.0f;
        for (size_t i = lo; i < std::min(g.size(), lo + 4096); ++i) s += g[i] * g[i];
        ss += s;
      }
    }
    const double norm = std::sqrt(ss);
    const float coef = std::min(1.0f, 1.0f / (static_cast<float>(norm) + 1e-6f));
    return Outputs{{"norm", {static_cast<float>(norm)}}, {"coef", {coef}}, {"coef_unclipped", {1.0f}}};
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename G>(G) {
      int64_t chunks = 0;
      for (int64_t n : sizes) chunks += jtok::cuda::sumsq_chunks(n);
      DeviceBuffer<float> partials(chunks), coef(1), coef_big(1);
      DeviceBuffer<double> ss(1), norm(1);
      std::vector<DeviceBuffer<G>> dg;
      int64_t at = 0;
      for (const auto& g : gs) {
        dg.push_back(upload<G>(g));
        jtok::cuda::sumsq_partials(partials.get() + at, dg.back().get(), static_cast<int64_t>(g.size()), nullptr);
        at += jtok::cuda::sumsq_chunks(static_cast<int64_t>(g.size()));
      }
      jtok::cuda::sum_partials(ss.get(), partials.get(), chunks, nullptr);
      jtok::cuda::clip_coef(coef.get(), norm.get(), ss.get(), 1.0f, nullptr);
      jtok::cuda::clip_coef(coef_big.get(), norm.get(), ss.get(), 1e9f, nullptr);
      const double nv = download_exact(norm)[0];
      return Outputs{{"norm", {static_cast<float>(nv)}}, {"coef", download(coef)}, {"coef_unclipped", download(coef_big)}};
    });
  };
  run_case(c);
  expect_deterministic(c, DType::f32);
}

// Telemetry's sums (cuda/stats.h) of L arrays of n values against a plain double loop over the same
// values: both exact to double rounding, compared after the cast to float. n 100,003: an element a
// thread, 256 blocks (the most), some threads two; 600,000: vectors, some threads two; 70 arrays of 800:
// two launches (64 a launch) of a block an array. The scratch starts as NaN, so totals that read a
// partial no block wrote fail.
void sums_and_squares_case(int64_t L, int64_t n) {
  std::vector<float> x = randn(L * n, 77);
  for (float& v : x) v += 0.5f;  // a mean away from zero
  CudaCase c{"sums_and_squares", "L " + std::to_string(L) + ", n " + std::to_string(n), {1e-6, 1e-6}};
  c.cpu = [&](DType t) {
    const std::vector<float> xt = to_dtype(x, t);
    std::vector<float> sums(2 * L);
    for (int64_t l = 0; l < L; ++l) {
      double s = 0, ss = 0;
      for (int64_t i = 0; i < n; ++i) s += xt[l * n + i], ss += static_cast<double>(xt[l * n + i]) * xt[l * n + i];
      sums[2 * l] = static_cast<float>(s), sums[2 * l + 1] = static_cast<float>(ss);
    }
    return Outputs{{"sums", sums}};
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename G>(G) {
      DeviceBuffer<G> dx = upload<G>(x);
      const int64_t scratch_n = jtok::cuda::sums_and_squares_scratch(L);
      DeviceBuffer<double> scratch = upload_exact(std::vector<double>(scratch_n, std::nan(""))), out(2 * L);
      std::vector<const G*> xs;
      for (int64_t l = 0; l < L; ++l) xs.push_back(dx.get() + l * n);
      jtok::cuda::sums_and_squares(out.get(), xs, n, scratch.get(), nullptr);
      const std::vector<double> got = download_exact(out);
      return Outputs{{"sums", std::vector<float>(got.begin(), got.end())}};
    });
  };
  run_case(c);
  expect_deterministic(c, DType::bf16);
}

TEST(CudaOps, SumsAndSquares) {
  sums_and_squares_case(1, 100003);
  sums_and_squares_case(2, 600000);
  sums_and_squares_case(70, 800);
}

// zero_spans (the step's clearing of the flat gradients, cuda/model_kernels.h) against std::fill over
// the same spans: spans of 1 element, across the kernel's chunks of 4,096, and back to back, the
// elements between them left as they were (bit for bit: exact on both sides).
TEST(CudaOps, ZeroSpans) {
  const std::vector<float> x = randn(30011, 78);
  const std::vector<jtok::cuda::Span> spans{{0, 1}, {3, 4094}, {4097, 5000}, {9097, 3}, {9200, 17000}, {30010, 1}};
  CudaCase c{"zero_spans", "n 30011, 6 spans", {0.0, 0.0}};
  c.cpu = [&](DType) {
    std::vector<float> y = x;
    for (const auto& s : spans) std::fill_n(y.begin() + s.offset, s.count, 0.0f);
    return Outputs{{"x", y}};
  };
  c.gpu = [&](DType) {
    DeviceBuffer<float> dx = upload<float>(x);
    jtok::cuda::zero_spans(dx.get(), jtok::cuda::upload_spans(spans), nullptr);
    jtok::cuda::zero_spans(dx.get(), jtok::cuda::upload_spans({}), nullptr);  // none: nothing launched
    return Outputs{{"x", download(dx)}};
  };
  run_case(c);
}

// The reference product, all four transpose combinations, with beta accumulating, against the
// CPU's gemm_f32 (the check the cuBLASLt path is also held to).
TEST(CudaOps, GemmRef) {
  const int64_t M = 33, N = 20, K = 37;
  const auto a = randn(M * K, 51), b = randn(K * N, 52), c0 = randn(M * N, 53);
  CudaCase c{"gemm_ref", "M 33, N 20, K 37, beta 0.5", {1e-6, 1e-2}};
  static const char* const kNames[4] = {"C nn", "C tn", "C nt", "C tt"};  // op(A), op(B) transposed?
  auto shapes = [&](bool ta, bool tb) { return std::pair<int64_t, int64_t>{ta ? M : K, tb ? K : N}; };
  c.cpu = [&](DType t) {
    const auto at = to_dtype(a, t), bt = to_dtype(b, t);
    Outputs o;
    for (int k = 0; k < 4; ++k) {
      const bool ta = k & 1, tb = k & 2;
      auto out = to_dtype(c0, t);
      jtok::gemm_f32(ta, tb, M, N, K, 1.5f, at.data(), shapes(ta, tb).first, bt.data(), shapes(ta, tb).second, 0.5f,
                     out.data(), N);
      o.push_back({kNames[k], out});
    }
    return o;
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename T>(T) {
      auto da = upload<T>(a), db = upload<T>(b);
      Outputs o;
      for (int k = 0; k < 4; ++k) {
        const bool ta = k & 1, tb = k & 2;
        auto dc = upload<T>(c0);
        jtok::cuda::gemm_ref<T, T>(ta, tb, M, N, K, 1.5f, da.get(), shapes(ta, tb).first, db.get(),
                                   shapes(ta, tb).second, 0.5f, dc.get(), N, nullptr);
        o.push_back({kNames[k], download(dc)});
      }
      return o;
    });
  };
  run_case(c);
}

// Cross-entropy over a padded vocabulary, in place (dlogits over logits), against the CPU op's
// per-row losses and gradient; the total loss through sum_partials.
TEST(CudaOps, CrossEntropy) {
  const int64_t N = 23, V = 1000, Vp = 1024;
  const float scale = 1.0f / N;
  const auto logits = randn(N * Vp, 61, 3.0f);
  const auto targets = skewed_ids(N, V, 62);
  CudaCase c{"cross_entropy", "N 23, V 1000, Vp 1024", {1e-6, 1e-2}};
  c.cpu = [&](DType t) {
    const auto lt = to_dtype(logits, t);
    std::vector<float> rows(N), d(N * Vp);
    jtok::cross_entropy_rows(rows.data(), lt.data(), targets.data(), N, V, Vp);
    const double total = jtok::cross_entropy(d.data(), lt.data(), targets.data(), N, V, Vp, scale);
    return Outputs{{"losses", rows}, {"dlogits", d}, {"total", {static_cast<float>(total)}}};
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename T>(T) {
      auto dl = upload<T>(logits);
      auto dt = upload_exact(targets);
      DeviceBuffer<float> losses(N);
      DeviceBuffer<double> total(1);
      jtok::cuda::cross_entropy(dl.get(), losses.get(), dl.get(), dt.get(), N, V, Vp, scale, nullptr);
      jtok::cuda::sum_partials(total.get(), losses.get(), N, nullptr);
      return Outputs{{"losses", download(losses)}, {"dlogits", download(dl)},
                     {"total", {static_cast<float>(download_exact(total)[0])}}};
    });
  };
  run_case(c);
  expect_deterministic(c, DType::bf16);
}

// The fused LM head + cross-entropy in chunks of 16 rows (the last one short) with the reference
// products, against the CPU's gemm_f32 + cross_entropy on the whole (N, Vp) logits; dW added to, or
// written over NaN (add false: a step's first backward, never reading it).
void expect_lm_head_cross_entropy(bool add) {
  const int64_t N = 37, C = 48, V = 300, Vp = 320, chunk = 16;
  const float scale = 1.0f / N;
  const auto h = randn(N * C, 71), W = randn(Vp * C, 72, 0.2f), dW0 = randn(Vp * C, 73, 0.01f);
  const auto targets = skewed_ids(N, V, 74);
  CudaCase c{add ? "lm_head_cross_entropy" : "lm_head_cross_entropy dW written",
             "N 37, C 48, V 300, Vp 320, chunk 16",
             {1e-5, 2e-2}};
  c.cpu = [&](DType t) {
    const auto ht = to_dtype(h, t), Wt = to_dtype(W, t);
    std::vector<float> logits(N * Vp), rows(N), dh(N * C), dW = add ? dW0 : std::vector<float>(dW0.size(), 0.0f);
    jtok::gemm_f32(false, true, N, Vp, C, 1.0f, ht.data(), C, Wt.data(), C, 0.0f, logits.data(), Vp);
    jtok::cross_entropy_rows(rows.data(), logits.data(), targets.data(), N, V, Vp);
    jtok::cross_entropy(logits.data(), logits.data(), targets.data(), N, V, Vp, scale);
    jtok::gemm_f32(false, false, N, C, Vp, 1.0f, logits.data(), Vp, Wt.data(), C, 0.0f, dh.data(), C);
    jtok::gemm_f32(true, false, Vp, C, N, 1.0f, logits.data(), Vp, ht.data(), C, 1.0f, dW.data(), C);
    return Outputs{{"losses", rows}, {"dh", dh}, {"dW", dW}};
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename T>(T) {
      auto dh_ = upload<T>(h), dW_ = upload<T>(W);
      auto dt = upload_exact(targets);
      auto ddW = upload<float>(add ? dW0 : std::vector<float>(dW0.size(), std::nanf("")));
      DeviceBuffer<float> losses(N);
      DeviceBuffer<T> ddh(N * C), scratch(chunk * Vp);
      jtok::cuda::lm_head_cross_entropy<T>(losses.get(), ddh.get(), ddW.get(), dh_.get(), dW_.get(), dt.get(), N, C, V,
                                           Vp, scale, scratch.get(), chunk, jtok::cuda::LmHeadGemms<T>{}, nullptr, add);
      return Outputs{{"losses", download(losses)}, {"dh", download(ddh)}, {"dW", download(ddW)}};
    });
  };
  run_case(c);
}

TEST(CudaOps, LmHeadCrossEntropy) {
  for (const bool add : {true, false}) expect_lm_head_cross_entropy(add);
}

}  // namespace
