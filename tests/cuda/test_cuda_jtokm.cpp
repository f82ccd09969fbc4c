// JTok-M's routing, mix + norm + injection and their backward (cuda/jtokm.h) against
// src/model/jtokm.cpp (tests/cuda/cuda_case.h). Part of test_cuda_ops; also compiled unchanged by
// tests/cuda/emulate_kernels.sh (no GPU).
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "cuda/gemm_ref.h"
#include "cuda/jtokm.h"
#include "cuda_case.h"
#include "device_dedup.h"
#include "model/jtokm.h"
#include "model/token_table.h"
#include "ops/linear.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

// A layer's aux loss as the trainer takes it, on the host from the device's P and n (model/jtokm.h).
double aux_loss(const std::vector<double>& prob_sum, const std::vector<int32_t>& load, int64_t N,
                const jtok::JTokMHyper& hp) {
  const std::vector<double> n(load.begin(), load.end());
  return jtok::jtokm_aux_loss(prob_sum.data(), n.data(), N, hp);
}

// JTok-M over n_e 5 tables, K 2, with and without the norm: routing (from the CPU's router logits:
// the product is the caller's, and near-ties must not flip the top-K), load statistics and aux
// loss, the (id, table) pairs chosen (the rows the CPU's gather syncs), mix + norm + injection, dL/de, ds, dL/dg
// through the router products (gemm_ref, as the model's: dR fp32 from operands of T, da of T), the tables' gradients
// (added to the rows already flagged touched, every third (table, id): an earlier micro-batch's; written over the stale
// values of the others the batch selects; the rest left as they are) and touched flags; against src/model/jtokm.cpp's
// forward and backward (e is never stored on the GPU: the backward mixes it again, checked through ds, dL/dg and gE).
// bf16: h_next, dh, s, the tables, a, R and da in bf16 (the CPU sees them rounded); routing, e, its norm, dL/de, ds
// and gE are fp32 in both, so only h_next, da and dR carry a bf16 rounding (of h_next's store, of dg): tolerance 1e-2
// on all.
struct JTokMRun {
  JTokMRun(int64_t n, bool with_norm) : N(n), norm(with_norm) {}  // the arrays below follow N
  static constexpr int64_t V = 150, d = 32, ne = 5, K = 2;
  int64_t N;
  bool norm;
  std::vector<int32_t> ids = skewed_ids(N, V, 121);
  std::vector<float> tables = randn(ne * V * d, 122, 0.5f), a = randn(N * d, 123), R = randn(ne * d, 124, 0.3f),
                     s = randn(d, 125, 0.3f), h0 = randn(N * d, 126), dh = randn(N * d, 127),
                     ds0 = randn(d, 128, 0.1f), da0 = randn(N * d, 129, 0.1f), dR0 = randn(ne * d, 130, 0.1f),
                     gE0 = randn(ne * V * d, 131, 0.01f);
  static constexpr float aux_grad = 3.0f;
  // The touched flags before the backward: every third (table, id) row.
  std::vector<uint8_t> flags0() const {
    std::vector<uint8_t> f(ne * V, 0);
    for (size_t r = 0; r < f.size(); r += 3) f[r] = 1;
    return f;
  }

  jtok::JTokMHyper hyper() const { return {ne, K, 0.25f, 1e-6f, norm, 1e-2}; }
  jtok::cuda::JTokMDims dims() const { return {N, d, V, ne, K, 0.25f, 1e-6f, norm, 1e-2}; }
  // The router's product as the CPU forward computes it (the same call, the same bits).
  std::vector<float> logits(const std::vector<float>& at, const std::vector<float>& Rt) const {
    std::vector<float> g(N * ne);
    jtok::gemm(false, true, N, ne, d, 1.0f, at.data(), d, Rt.data(), d, 0.0f, g.data(), ne);
    return g;
  }

  Outputs cpu(DType t) const {
    const auto at = to_dtype(a, t), Rt = to_dtype(R, t), tt = to_dtype(tables, t), st = to_dtype(s, t);
    const auto dht = to_dtype(dh, t);
    std::vector<jtok::TokenTable> E;
    for (int64_t i = 0; i < ne; ++i)
      E.push_back(
          jtok::TokenTable::in_ram(V, d, std::vector<float>(tt.begin() + i * V * d, tt.begin() + (i + 1) * V * d)));
    const jtok::RowBatch rb = jtok::dedup_ids(ids.data(), N, V);
    jtok::JTokMActs A;
    std::vector<float> h = to_dtype(h0, t), da = to_dtype(da0, t), dR = dR0, ds = ds0;
    jtok::jtokm_forward(h.data(), A, at.data(), Rt.data(), st.data(), E.data(), rb, N, d, hyper());
    std::vector<jtok::SparseRowGrad> g(ne);
    for (auto& gi : g) gi.init(V, d);
    jtok::jtokm_backward(da.data(), dR.data(), ds.data(), g.data(), A, dht.data(), at.data(), Rt.data(), st.data(), rb,
                         N, d, hyper(), aux_grad);
    const std::vector<uint8_t> f0 = flags0();
    std::vector<float> gE = gE0, touched(f0.begin(), f0.end());
    for (int64_t i = 0; i < ne; ++i) {
      const auto gi = jtok::densify(g[i], V);
      for (int32_t id : g[i].ids) {
        const int64_t row = i * V + id;
        for (int64_t j = 0; j < d; ++j) gE[row * d + j] = (f0[row] ? gE0[row * d + j] : 0.0f) + gi[id * d + j];
        touched[row] = 1.0f;
      }
    }
    std::vector<float> chosen(rb.unique.size(), 0.0f);  // the (id, table) pairs the CPU's gather read
    for (size_t u = 0; u < chosen.size(); ++u) {
      uint32_t bits = 0;
      for (int64_t i = 0; i < ne; ++i)
        if (A.slot[u * ne + i] >= 0) bits |= 1u << i;
      chosen[u] = static_cast<float>(bits);
    }
    return Outputs{{"sel", std::vector<float>(A.sel.begin(), A.sel.end())},
                   {"w", A.w},
                   {"chosen", chosen},
                   {"inv_norm", A.inv_norm},
                   {"h_next", h},
                   {"aux", {static_cast<float>(A.aux)}},
                   {"load", std::vector<float>(A.load.begin(), A.load.end())},
                   {"prob_sum", std::vector<float>(A.prob_sum.begin(), A.prob_sum.end())},
                   {"ds", ds},
                   {"dR", dR},
                   {"da", da},
                   {"gE", gE},
                   {"touched", touched}};
  }

  // T: the activations' type (the model's E).
  template <typename T>
  Outputs gpu_as(DType t) const {
    const auto at = to_dtype(a, t), Rt = to_dtype(R, t);
    const jtok::cuda::JTokMDims dm = dims();
    auto dids = upload_exact(ids);
    auto dE = upload<T>(tables), da_in = upload<T>(at), dR_in = upload<T>(Rt), ds_ = upload<T>(s), dhn = upload<T>(h0),
         ddh = upload<T>(dh), dda = upload<T>(da0);
    auto dlog = upload<float>(logits(at, Rt)), dds = upload<float>(ds0), ddR = upload<float>(dR0),
         dgE = upload<float>(gE0);
    DeviceBuffer<float> sig(N * ne), w(N * K), inv(N), prob(ne), de(N * d),
        scratch(jtok::cuda::jtokm_backward_de_scratch(dm)), hot(jtok::cuda::jtokm_backward_tables_scratch(dm));
    DeviceBuffer<T> dg(N * ne);
    DeviceBuffer<int32_t> sel(N * K), load(ne);
    DeviceBuffer<double> prob_sum(ne);
    auto touched = upload_exact(flags0());
    const jtok::cuda::JTokMDeviceActs acts{sig.get(), sel.get(), w.get(), inv.get(), load.get(), prob_sum.get()};
    DeviceDedup dd(dids, N, V);
    DeviceBuffer<uint32_t> chosen(N);
    jtok::cuda::jtokm_route(acts, dlog.get(), dm, nullptr, {chosen.get(), dd.rb});
    jtok::cuda::jtokm_route_stats(acts, dm, nullptr);
    jtok::cuda::jtokm_mix_inject(dhn.get(), acts, dids.get(), dE.get(), ds_.get(), dm, nullptr);
    jtok::cuda::jtokm_backward_de(de.get(), dds.get(), dg.get(), scratch.get(), acts, ddh.get(), ds_.get(), dids.get(),
                                  dE.get(), aux_grad, dm, nullptr);
    jtok::cuda::gemm_ref<T, float>(true, false, ne, d, N, 1.0f, dg.get(), ne, da_in.get(), d, 1.0f, ddR.get(), d,
                                   nullptr);
    jtok::cuda::gemm_ref<T, T>(false, false, N, d, ne, 1.0f, dg.get(), ne, dR_in.get(), d, 1.0f, dda.get(), d,
                               nullptr);
    jtok::cuda::jtokm_backward_tables(dgE.get(), touched.get(), acts, de.get(), dd.rb, dm, hot.get(), nullptr);
    const auto sl = download_exact(sel), ld = download_exact(load);
    const auto tb = download_exact(touched);
    const auto ps = download_exact(prob_sum);
    const auto ch = download_exact(chosen);
    const size_t U = jtok::dedup_ids(ids.data(), N, V).unique.size();
    return Outputs{{"sel", std::vector<float>(sl.begin(), sl.end())},
                   {"w", download(w)},
                   {"chosen", std::vector<float>(ch.begin(), ch.begin() + static_cast<int64_t>(U))},
                   {"inv_norm", download(inv)},
                   {"h_next", download(dhn)},
                   {"aux", {static_cast<float>(aux_loss(ps, ld, N, hyper()))}},
                   {"load", std::vector<float>(ld.begin(), ld.end())},
                   {"prob_sum", std::vector<float>(ps.begin(), ps.end())},
                   {"ds", download(dds)},
                   {"dR", download(ddR)},
                   {"da", download(dda)},
                   {"gE", download(dgE)},
                   {"touched", std::vector<float>(tb.begin(), tb.end())}};
  }
  Outputs gpu(DType t) const {
    return by_dtype(t, [&]<typename T>(T) { return gpu_as<T>(t); });
  }
};

// 200 positions: dL/de's blocks a position each; 2,600: 6 a block (of 512), 4 at a time, then 2.
TEST(CudaOps, Jtokm) {
  for (const auto& [N, norm] :
       std::initializer_list<std::pair<int64_t, bool>>{{200, true}, {200, false}, {2600, true}}) {
    const JTokMRun run(N, norm);
    CudaCase c{norm ? "jtokm" : "jtokm no-norm", "N " + std::to_string(N) + ", V 150, d 32, n_e 5, K 2", {2e-6, 1e-2}};
    c.cpu = [&](DType t) { return run.cpu(t); };
    c.gpu = [&](DType t) { return run.gpu(t); };
    run_case(c);
    expect_deterministic(c, DType::f32);
    expect_deterministic(c, DType::bf16);
  }
}

// Routing alone over more positions than jtokm_route_stats_kernel has threads (3,000: two or three a
// thread), n_e 7, K 3: sel, w, sig, and the statistics each table's block sums (load exact,
// prob_sum, weight_sum) and the aux loss the host takes from them, against the CPU's jtokm_route on the same logits.
TEST(CudaOps, JtokmRouteStatsOverManyPositions) {
  constexpr int64_t N = 3000, V = 90, d = 16, ne = 7, K = 3;
  const auto ids = skewed_ids(N, V, 141);
  const auto a = randn(N * d, 142), R = randn(ne * d, 143, 0.5f);
  const jtok::JTokMHyper hp{ne, K, 0.25f, 1e-6f, true, 1e-2};
  CudaCase c{"jtokm route", "N 3000, n_e 7, K 3", {1e-6, 1e-6}};  // fp32 routing in both dtypes
  const auto cpu_acts = [&] {
    jtok::JTokMActs A;
    jtok::jtokm_route(A, a.data(), R.data(), jtok::dedup_ids(ids.data(), N, V), N, d, hp);
    return A;
  };
  c.cpu = [&](DType) {
    const jtok::JTokMActs A = cpu_acts();
    return Outputs{{"sel", std::vector<float>(A.sel.begin(), A.sel.end())},
                   {"w", A.w},
                   {"sig", A.sig},
                   {"load", std::vector<float>(A.load.begin(), A.load.end())},
                   {"prob_sum", std::vector<float>(A.prob_sum.begin(), A.prob_sum.end())},
                   {"weight_sum", std::vector<float>(A.weight_sum.begin(), A.weight_sum.end())},
                   {"aux", {static_cast<float>(A.aux)}}};
  };
  c.gpu = [&](DType) {
    auto logits = upload<float>(cpu_acts().logits);  // the router's product is the caller's
    DeviceBuffer<float> sig(N * ne), w(N * K);
    DeviceBuffer<int32_t> sel(N * K), load(ne);
    DeviceBuffer<double> prob_sum(ne), wsum(ne);
    const jtok::cuda::JTokMDeviceActs acts{sig.get(),  sel.get(),      w.get(),   nullptr,
                                           load.get(), prob_sum.get(), wsum.get()};
    const jtok::cuda::JTokMDims dm{N, d, V, ne, K, 0.25f, 1e-6f, true, 1e-2};
    jtok::cuda::jtokm_route(acts, logits.get(), dm, nullptr);
    jtok::cuda::jtokm_route_stats(acts, dm, nullptr);
    const auto sl = download_exact(sel), ld = download_exact(load);
    const auto ps = download_exact(prob_sum), ws = download_exact(wsum);
    return Outputs{{"sel", std::vector<float>(sl.begin(), sl.end())},
                   {"w", download(w)},
                   {"sig", download(sig)},
                   {"load", std::vector<float>(ld.begin(), ld.end())},
                   {"prob_sum", std::vector<float>(ps.begin(), ps.end())},
                   {"weight_sum", std::vector<float>(ws.begin(), ws.end())},
                   {"aux", {static_cast<float>(aux_loss(ps, ld, N, hp))}}};
  };
  run_case(c);
  expect_deterministic(c, DType::f32);
}

}  // namespace
