// src/cuda's op families run on the CPU through their real host launchers (tests/cuda/emu: the .cu
// rewritten by cu2cpp.py, the kernels' threads as fibers) against the CPU engine's ops, by
// tests/cuda/cuda_case.h's normalised error at the tolerances the GPU tests state
// (tests/cuda/test_cuda_ops.cpp), fp32 and bf16. Shapes as the GPU tests' (already small).
//   bash tests/cuda/emulate_kernels.sh
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "cuda/adamw.h"
#include "cuda/cross_entropy.h"
#include "cuda/global_norm.h"
#include "cuda/rmsnorm.h"
#include "cuda/rope.h"
#include "cuda/swiglu.h"
#include "cuda_case.h"
#include "ops/adamw.h"
#include "ops/cross_entropy.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;
using bf16 = __nv_bfloat16;

// RMSNorm forward (out, rstd) and backward (dinp accumulated onto a nonzero start, dweight likewise).
TEST(EmulatedOps, Rmsnorm) {
  const int64_t N = 37, C = 200;  // C not a multiple of 32 or of the block; N not of 8 rows a block
  const float eps = 1e-5f;
  const auto x = randn(N * C, 1), w = randn(C, 2, 0.5f), dy = randn(N * C, 3), dx0 = randn(N * C, 4, 0.1f),
             dw0 = randn(C, 5, 0.1f);
  CudaCase c{"rmsnorm", "N 37, C 200", {2e-6, 1e-2}};
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

// SwiGLU on gate / up read from a fused (N, 2F) row (ld 2F), against the CPU op on separate arrays.
TEST(EmulatedOps, Swiglu) {
  const int64_t N = 19, F = 72, ld = 2 * F;
  const auto gu = randn(N * ld, 11, 2.0f), dy = randn(N * F, 12);
  CudaCase c{"swiglu", "N 19, F 72, ld 144", {1e-6, 1e-2}};
  c.cpu = [&](DType t) {
    const auto gut = to_dtype(gu, t), dyt = to_dtype(dy, t);
    std::vector<float> g(N * F), u(N * F), out(N * F), dg(N * F), du(N * F), dgu(N * ld);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t f = 0; f < F; ++f) g[n * F + f] = gut[n * ld + f], u[n * F + f] = gut[n * ld + F + f];
    jtok::swiglu_forward(out.data(), g.data(), u.data(), N * F);
    jtok::swiglu_backward(dg.data(), du.data(), dyt.data(), g.data(), u.data(), N * F);
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

// RoPE on q inside a fused qkv row (the k and v parts come back untouched), forward and backward.
TEST(EmulatedOps, Rope) {
  const int64_t B = 2, T = 7, H = 3, hd = 16, stride = 5 * hd;
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

// AdamW: three steps with a gradient (clip coefficient read on the device), one without; the bf16
// copy is the device's own p rounded, bit for bit.
TEST(EmulatedOps, Adamw) {
  const int64_t n = 5000;
  const auto p0 = randn(n, 31, 0.02f), g = randn(n, 32, 0.5f);
  const std::vector<float> m0(n), v0(n);
  const float clip = 0.7f;
  auto hyper = [](int64_t step) { return jtok::AdamWHyper{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.7f}; };
  CudaCase c{"adamw", "n 5000, 3 steps + 1 without grad", {1e-6, 1e-6}};
  c.cpu = [&](DType t) {
    const auto gt = to_dtype(g, t);
    std::vector<float> p = p0, m = m0, v = v0;
    for (int64_t k = 1; k <= 3; ++k) jtok::adamw_update(p.data(), gt.data(), m.data(), v.data(), n, hyper(k));
    jtok::adamw_elements(p.data(), nullptr, m.data(), v.data(), n, jtok::adamw_consts(hyper(4)));
    return Outputs{{"p", p}, {"m", m}, {"v", v}};
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename G>(G) {
      auto dp = upload<float>(p0), dm = upload<float>(m0), dv = upload<float>(v0), dscale = upload<float>({clip});
      auto dg = upload<G>(g);
      DeviceBuffer<bf16> pb(n);
      for (int64_t k = 1; k <= 4; ++k) {
        const jtok::AdamWStepConsts h = jtok::adamw_consts(hyper(k));
        const jtok::cuda::AdamWConsts cc{h.b1, h.b2, h.eps, h.step_size, h.inv_sqrt_bc2, h.decay};
        jtok::cuda::adamw_update<G>(dp.get(), pb.get(), k <= 3 ? dg.get() : nullptr, dm.get(), dv.get(), n, cc,
                                    dscale.get(), nullptr);
      }
      const std::vector<float> p = download(dp);
      expect_bf16_copy(download(pb), p);
      return Outputs{{"p", p}, {"m", download(dm)}, {"v", download(dv)}};
    });
  };
  run_case(c);
  expect_deterministic(c, DType::f32);
}

// Global norm over three tensors and the clip coefficient (fp32 per 4096 chunk, double over chunks).
TEST(EmulatedOps, GlobalNorm) {
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

// Cross-entropy losses and dlogits in place (padded rows, Vp > V), the losses summed by sum_partials.
TEST(EmulatedOps, CrossEntropy) {
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

}  // namespace
