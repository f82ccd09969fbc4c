// The GPU model's MoE block (src/cuda/model_moe.h: grouped expert products, shared experts, bf16
// activations in the bf16 run) against src/model/moe.cpp's moe_forward / moe_backward, and the
// grouped products alone (src/cuda/grouped_linear.h) against ops/linear.h's products expert by
// expert (tests/cuda/cuda_case.h). The routing kernels alone: test_cuda_moe_route.cpp. Part of
// test_cuda_ops.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/device_array.h"
#include "cuda/grouped_linear.h"
#include "cuda/matmul.h"
#include "cuda/model_moe.h"
#include "cuda_case.h"
#include "model/moe.h"
#include "ops/linear.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

// The model's block (cuda/model_moe.h) with a shared expert: weights in MoeWeights' order (router,
// shared gate / up / down, the experts), out and dx accumulated onto nonzero starts. The CPU side
// sees every input as the dtype holds it, the bf16 run's output starts and dout included.
struct MoeBlockRun {
  static constexpr int64_t N = 67, d = 64, E = 5, K = 2, F = 40, S = 48;
  static constexpr double aux_coef = 0.01;
  static constexpr float aux_grad = 2.0f;
  static constexpr int64_t n_weights = E * d + 3 * S * d + E * 3 * F * d;
  std::vector<float> x = randn(N * d, 151), wbuf = randn(n_weights, 152, 0.2f), out0 = randn(N * d, 153),
                     dout = randn(N * d, 154), dx0 = randn(N * d, 155, 0.1f);

  static jtok::MoeDims dims() { return {d, E, K, F, S, true, aux_coef}; }
  template <typename P>
  static jtok::cuda::DeviceMoeView<P> view(P* buf) {
    return {buf, buf + E * d, buf + E * d + S * d, buf + E * d + 2 * S * d, buf + E * d + 3 * S * d};
  }

  Outputs cpu(DType t) const {
    auto xt = to_dtype(x, t), wt = to_dtype(wbuf, t), out = to_dtype(out0, t), dx = to_dtype(dx0, t);
    const auto dt = to_dtype(dout, t);
    std::vector<float> g(wt.size(), 0.0f);
    const jtok::MoeWeights w{wt.data(), wt.data() + E * d, wt.data() + E * d + S * d, wt.data() + E * d + 2 * S * d,
                             wt.data() + E * d + 3 * S * d};
    const jtok::MoeWeights gw{g.data(), g.data() + E * d, g.data() + E * d + S * d, g.data() + E * d + 2 * S * d,
                              g.data() + E * d + 3 * S * d};
    jtok::MoeActs a;
    jtok::moe_forward(out.data(), a, xt.data(), w, dims(), N);
    jtok::MoeScratch s;
    jtok::moe_backward(dx.data(), gw, s, dt.data(), xt.data(), a, w, dims(), N, aux_grad);
    return Outputs{{"out", out}, {"aux", {static_cast<float>(a.aux)}}, {"dx", dx}, {"grads", g}};
  }

  template <typename T>
  Outputs gpu() const {
    auto xd = upload<T>(x), wd = upload<T>(wbuf), out = upload<T>(out0), dod = upload<T>(dout), dx = upload<T>(dx0);
    auto g = upload<float>(std::vector<float>(wbuf.size(), 0.0f));
    jtok::cuda::DeviceMoeActs<T> a;
    jtok::cuda::DeviceMoeScratch<T> s;
    jtok::cuda::size_moe_acts(a, dims(), N);
    jtok::cuda::size_moe_scratch(s, dims(), N);
    jtok::cuda::Matmul mm;
    jtok::cuda::moe_block_forward(mm, out.get(), a, s, xd.get(), view(wd.get()), dims(), N, nullptr);
    jtok::cuda::moe_block_backward(mm, dx.get(), view(g.get()), s, dod.get(), xd.get(), a, view(wd.get()), dims(), N,
                                   aux_grad, nullptr);
    double aux = 0;
    jtok::cuda::copy_to_host(&aux, a.aux.get(), 1, nullptr);
    return Outputs{{"out", download(out)}, {"aux", {static_cast<float>(aux)}}, {"dx", download(dx)},
                   {"grads", download(g)}};
  }
};

TEST(CudaOps, MoeBlock) {
  MoeBlockRun run;
  CudaCase c{"moe block", "N 67, d 64, E 5, K 2, F 40, S 48", {2e-5, 3e-2}};
  c.cpu = [&](DType t) { return run.cpu(t); };
  c.gpu = [&](DType t) { return by_dtype(t, [&](auto tag) { return run.gpu<decltype(tag)>(); }); };
  run_case(c);
  expect_deterministic(c, DType::f32);
  expect_deterministic(c, DType::bf16);
}

// The grouped products over experts of 70, 0, 1, 130, 64 and 5 rows (an empty expert, one row, tiles
// cut at 64 and past two tiles), weights `stride` apart with a gap between them that must stay
// untouched, C and OC not multiples of the tiles or of 8 (no aligned rows); dx and dW accumulated onto
// nonzero starts.
struct GroupedLinearRun {
  std::vector<int32_t> offsets{0, 70, 70, 71, 201, 265, 270};
  int64_t C, OC, E = 6, rows = 270, stride;
  std::vector<float> x, w, dy, dx0, dw0;
  GroupedLinearRun(int64_t c, int64_t oc)
      : C(c),
        OC(oc),
        stride(c * oc + 7),
        x(randn(rows * c, 161)),
        w(randn(E * stride, 162, 0.2f)),
        dy(randn(rows * oc, 163)),
        dx0(randn(rows * c, 164, 0.1f)),
        dw0(randn(E * stride, 165, 0.1f)) {}

  Outputs cpu(DType t) const {
    auto xt = to_dtype(x, t), wt = to_dtype(w, t), dyt = to_dtype(dy, t), dx = to_dtype(dx0, t);
    std::vector<float> y(static_cast<size_t>(rows * OC)), dw = dw0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = offsets[e], ne = offsets[e + 1] - r0;
      if (ne == 0) continue;
      jtok::linear_forward(y.data() + r0 * OC, xt.data() + r0 * C, wt.data() + e * stride, ne, C, OC);
      jtok::linear_backward(dx.data() + r0 * C, dw.data() + e * stride, dyt.data() + r0 * OC, xt.data() + r0 * C,
                            wt.data() + e * stride, ne, C, OC);
    }
    return Outputs{{"y", y}, {"dx", dx}, {"dw", dw}};
  }

  template <typename T>
  Outputs gpu() const {
    auto xd = upload<T>(x), wd = upload<T>(w), dyd = upload<T>(dy), dx = upload<T>(dx0);
    auto dw = upload<float>(dw0), y = upload<T>(std::vector<float>(rows * OC, 7.0f));  // all overwritten
    jtok::cuda::DeviceArray<int32_t> off;
    off.resize(E + 1);
    jtok::cuda::copy_to_device(off.get(), offsets.data(), E + 1);
    const jtok::cuda::ExpertGroups g{off.get(), E, rows, stride};
    jtok::cuda::grouped_linear_forward<T>(y.get(), xd.get(), wd.get(), g, C, OC, nullptr);
    jtok::cuda::grouped_linear_backward<T>(dx.get(), dw.get(), dyd.get(), xd.get(), wd.get(), g, C, OC, nullptr);
    return Outputs{{"y", download(y)}, {"dx", download(dx)}, {"dw", download(dw)}};
  }
};

TEST(CudaOps, GroupedLinear) {
  for (const auto& [C, OC] : {std::pair<int64_t, int64_t>{40, 72}, {72, 40}, {128, 850}}) {
    GroupedLinearRun run(C, OC);
    CudaCase c{
        "grouped linear", "6 experts, 270 rows, C " + std::to_string(C) + ", OC " + std::to_string(OC), {1e-5, 1e-2}};
    c.cpu = [&](DType t) { return run.cpu(t); };
    c.gpu = [&](DType t) { return by_dtype(t, [&](auto tag) { return run.gpu<decltype(tag)>(); }); };
    run_case(c);
    expect_deterministic(c, DType::bf16);
  }
}

}  // namespace
