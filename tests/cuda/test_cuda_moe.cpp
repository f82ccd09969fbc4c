// The GPU model's MoE block (src/cuda/model_moe.h: cuBLASLt, shared experts, bf16 activations in the
// bf16 run) against src/model/moe.cpp's moe_forward / moe_backward (tests/cuda/cuda_case.h). The
// routing kernels alone: test_cuda_moe_route.cpp. Part of test_cuda_ops.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/device_array.h"
#include "cuda/matmul.h"
#include "cuda/model_moe.h"
#include "cuda_case.h"
#include "model/moe.h"

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

}  // namespace
