// MoE routing on the GPU against src/model/moe.cpp (tests/cuda/cuda_case.h): a whole routed-experts
// block, forward and backward, from the routing kernels (src/cuda/moe.h: route, group through
// dedup.cu's sort, gather, combine and their backward), the reference products (gemm_ref, one per
// expert and projection over the offsets copied back) and swiglu.h, against the CPU's moe_forward /
// moe_backward, norm_topk on and off. Part of test_cuda_ops; also compiled unchanged by
// tests/cuda/emulate_kernels.sh (no cuBLASLt here: the model's block is test_cuda_moe.cpp's).
#include <gtest/gtest.h>

#include <vector>

#include "cuda/gemm_ref.h"
#include "cuda/moe.h"
#include "cuda/swiglu.h"
#include "cuda_case.h"
#include "model/moe.h"
#include "ops/linear.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

// C (M,N) = op(A) @ op(B) + beta C by the reference product (gemm_ref.h), fp32, the default stream.
void prod(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
          float beta, float* C, int64_t ldc) {
  jtok::cuda::gemm_ref<float, float>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, nullptr);
}

struct MoeRun {
  static constexpr int64_t N = 64, d = 32, E = 6, K = 2, F = 24, NK = N * K;
  bool norm_topk = true;
  static constexpr double aux_coef = 0.01;
  static constexpr float aux_grad = 2.0f;
  std::vector<float> x = randn(N * d, 141), wbuf = randn(E * d + E * 3 * F * d, 142, 0.2f), out0 = randn(N * d, 143),
                     dout = randn(N * d, 144), dx0 = randn(N * d, 145, 0.1f);

  jtok::MoeDims dims() const { return {d, E, K, F, 0, norm_topk, aux_coef}; }
  jtok::cuda::MoeRouteDims route_dims() const { return {N, E, K, norm_topk, aux_coef}; }
  static jtok::MoeWeights weights(float* buf) { return {buf, nullptr, nullptr, nullptr, buf + E * d}; }
  static int64_t gate(int64_t e) { return E * d + e * 3 * F * d; }  // expert e's matrices in the buffer
  static int64_t up(int64_t e) { return gate(e) + F * d; }
  static int64_t down(int64_t e) { return gate(e) + 2 * F * d; }

  Outputs cpu(DType t) const {
    auto xt = to_dtype(x, t), wt = to_dtype(wbuf, t);
    std::vector<float> g(wt.size(), 0.0f), out = out0, dx = dx0;
    jtok::MoeActs a;
    jtok::moe_forward(out.data(), a, xt.data(), weights(wt.data()), dims(), N);
    jtok::MoeScratch s;
    jtok::moe_backward(dx.data(), weights(g.data()), s, dout.data(), xt.data(), a, weights(wt.data()), dims(), N, aux_grad);
    return Outputs{{"probs", a.probs}, {"topi", std::vector<float>(a.topi.begin(), a.topi.end())}, {"topw", a.topw},
                   {"offsets", std::vector<float>(a.offsets.begin(), a.offsets.end())},
                   {"row_of", std::vector<float>(a.row_of.begin(), a.row_of.end())},
                   {"aux", {static_cast<float>(a.aux)}}, {"out", out}, {"dx", dx}, {"grads", g}};
  }

  // The device side: routing arrays, activations, gradients.
  struct Dev {
    DeviceBuffer<float> x, w, g, logits, probs, topw, frac, xg, G, U, act, eo, out, deo, dlogits, dact, dG, dU, dxg, dx, dout;
    DeviceBuffer<int32_t> topi, offsets, slot_of, row_of;
    DeviceBuffer<double> aux;
    DeviceBuffer<char> scratch;
    jtok::cuda::MoeDeviceRoute r;
    std::vector<int32_t> off;  // offsets on the host, for the per-expert products
  };

  void forward(Dev& v) const {
    const auto m = route_dims();
    jtok::cuda::moe_route(v.r, v.logits.get(), m, nullptr);
    jtok::cuda::moe_group(v.r, v.scratch.get(), v.scratch.n, m, nullptr);
    v.off = download_exact(v.offsets);
    jtok::cuda::moe_gather(v.xg.get(), v.x.get(), v.r, m, d, nullptr);
    const float* w = v.w.get();
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = v.off[e], ne = v.off[e + 1] - r0;
      prod(false, true, ne, F, d, v.xg.get() + r0 * d, d, w + gate(e), d, 0.0f, v.G.get() + r0 * F, F);
      prod(false, true, ne, F, d, v.xg.get() + r0 * d, d, w + up(e), d, 0.0f, v.U.get() + r0 * F, F);
    }
    jtok::cuda::swiglu_forward(v.act.get(), v.G.get(), v.U.get(), NK, F, F, nullptr);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = v.off[e], ne = v.off[e + 1] - r0;
      prod(false, true, ne, d, F, v.act.get() + r0 * F, F, w + down(e), F, 0.0f, v.eo.get() + r0 * d, d);
    }
    jtok::cuda::moe_combine(v.out.get(), v.eo.get(), v.r, m, d, nullptr);
  }

  void backward(Dev& v) const {
    const auto m = route_dims();
    const float* w = v.w.get();
    float* g = v.g.get();
    jtok::cuda::moe_combine_backward(v.deo.get(), v.dlogits.get(), v.dout.get(), v.eo.get(), v.r, m, d, aux_grad, nullptr);
    prod(false, false, N, d, E, v.dlogits.get(), E, w, d, 1.0f, v.dx.get(), d);
    prod(true, false, E, d, N, v.dlogits.get(), E, v.x.get(), d, 1.0f, g, d);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = v.off[e], ne = v.off[e + 1] - r0;
      prod(false, false, ne, F, d, v.deo.get() + r0 * d, d, w + down(e), F, 0.0f, v.dact.get() + r0 * F, F);
      prod(true, false, d, F, ne, v.deo.get() + r0 * d, d, v.act.get() + r0 * F, F, 1.0f, g + down(e), F);
    }
    jtok::cuda::swiglu_backward(v.dG.get(), v.dU.get(), v.dact.get(), v.G.get(), v.U.get(), NK, F, F, nullptr);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = v.off[e], ne = v.off[e + 1] - r0;
      float* dxg = v.dxg.get() + r0 * d;
      prod(false, false, ne, d, F, v.dG.get() + r0 * F, F, w + gate(e), d, 0.0f, dxg, d);
      prod(false, false, ne, d, F, v.dU.get() + r0 * F, F, w + up(e), d, 1.0f, dxg, d);
      prod(true, false, F, d, ne, v.dG.get() + r0 * F, F, v.xg.get() + r0 * d, d, 1.0f, g + gate(e), d);
      prod(true, false, F, d, ne, v.dU.get() + r0 * F, F, v.xg.get() + r0 * d, d, 1.0f, g + up(e), d);
    }
    jtok::cuda::moe_scatter_backward(v.dx.get(), v.dxg.get(), v.r, m, d, nullptr);
  }

  Outputs gpu(DType t) const {
    const auto xt = to_dtype(x, t), wt = to_dtype(wbuf, t);
    std::vector<float> logits(N * E);
    jtok::linear_forward(logits.data(), xt.data(), wt.data(), N, d, E);  // moe_forward's router product
    Dev v{upload<float>(xt), upload<float>(wt), upload<float>(std::vector<float>(wt.size())), upload<float>(logits),
          DeviceBuffer<float>(N * E), DeviceBuffer<float>(NK), DeviceBuffer<float>(E), DeviceBuffer<float>(NK * d),
          DeviceBuffer<float>(NK * F), DeviceBuffer<float>(NK * F), DeviceBuffer<float>(NK * F),
          DeviceBuffer<float>(NK * d), upload<float>(out0), DeviceBuffer<float>(NK * d), DeviceBuffer<float>(N * E),
          DeviceBuffer<float>(NK * F), DeviceBuffer<float>(NK * F), DeviceBuffer<float>(NK * F),
          DeviceBuffer<float>(NK * d), upload<float>(dx0), upload<float>(dout), DeviceBuffer<int32_t>(NK),
          DeviceBuffer<int32_t>(E + 1), DeviceBuffer<int32_t>(NK), DeviceBuffer<int32_t>(NK), DeviceBuffer<double>(1),
          DeviceBuffer<char>(jtok::cuda::moe_group_scratch_bytes(route_dims())), {}, {}};
    v.r = {v.probs.get(), v.topi.get(), v.topw.get(), v.offsets.get(), v.slot_of.get(), v.row_of.get(), v.frac.get(),
           v.aux.get()};
    forward(v);
    backward(v);
    const auto ti = download_exact(v.topi), ro = download_exact(v.row_of);
    return Outputs{{"probs", download(v.probs)}, {"topi", std::vector<float>(ti.begin(), ti.end())},
                   {"topw", download(v.topw)}, {"offsets", std::vector<float>(v.off.begin(), v.off.end())},
                   {"row_of", std::vector<float>(ro.begin(), ro.end())},
                   {"aux", {static_cast<float>(download_exact(v.aux)[0])}}, {"out", download(v.out)},
                   {"dx", download(v.dx)}, {"grads", download(v.g)}};
  }
};

TEST(CudaOps, Moe) {
  for (bool norm_topk : {true, false}) {
    MoeRun run;
    run.norm_topk = norm_topk;
    CudaCase c{norm_topk ? "moe norm_topk" : "moe", "N 64, d 32, E 6, K 2, F 24", {1e-5, 1e-5}};
    c.cpu = [&](DType t) { return run.cpu(t); };
    c.gpu = [&](DType t) { return run.gpu(t); };
    run_case(c);
    expect_deterministic(c, DType::f32);
  }
}

}  // namespace
