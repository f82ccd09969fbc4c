// JTok's gather / norm / gate and their backward (cuda/jtok.h), the device RowBatch by dedup.cu,
// against src/model/jtok.cpp (tests/cuda/cuda_case.h). Part of test_cuda_ops; also compiled
// unchanged by tests/cuda/emulate_kernels.sh (no GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cuda/jtok.h"
#include "cuda_case.h"
#include "device_dedup.h"
#include "model/jtok.h"
#include "model/token_table.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

// JTok with and without the norm: prepare (normalised unique rows, 1/(||E||+eps)), the gate on the
// MLP update, and the backward (dmlp: every position's written by the table gradient's blocks, over
// NaN, a hot id's by its pieces'; ds accumulated, the table gradient: added to a row already
// flagged touched (every third id: an earlier micro-batch's), written over the stale values of one
// not flagged, the other rows left as they are; the touched flags), against src/model/jtok.cpp.
TEST(CudaOps, Jtok) {
  const int64_t N = 300, V = 400, d = 48;
  const float eps = 1e-6f;
  const auto ids = skewed_ids(N, V, 101);
  const auto e = randn(V * d, 102, 0.5f), hm = randn(N * d, 103), mo = randn(N * d, 104), sc = randn(d, 105, 0.3f),
             dh = randn(N * d, 106), ds0 = randn(d, 107, 0.1f), gE0 = randn(V * d, 108, 0.01f);
  const jtok::RowBatch rb = jtok::dedup_ids(ids.data(), N, V);
  const int64_t U = static_cast<int64_t>(rb.unique.size());
  for (bool norm : {true, false}) {
    CudaCase c{norm ? "jtok" : "jtok no-norm", "N 300, V 400, d 48", {2e-6, 2e-2}};
    c.cpu = [&](DType t) {
      const jtok::TokenTable E = jtok::TokenTable::in_ram(V, d, to_dtype(e, t));
      const auto hmt = to_dtype(hm, t), st = to_dtype(sc, t), dht = to_dtype(dh, t);
      jtok::JTokActs a;
      jtok::jtok_prepare(a, E, rb, eps, norm);
      a.mlp_out = to_dtype(mo, t);
      std::vector<float> hn(N * d), dmlp(N * d), ds = ds0;
      jtok::jtok_forward(hn.data(), hmt.data(), a, st.data(), rb, N, d);
      jtok::SparseRowGrad g;
      g.init(V, d);
      jtok::jtok_backward(dmlp.data(), ds.data(), g, dht.data(), a, st.data(), rb, N, d, norm);
      const std::vector<float> gb = jtok::densify(g, V);
      std::vector<float> gE = gE0, touched(V, 0.0f);
      for (int64_t r = 0; r < V; r += 3) touched[r] = 1.0f;
      for (int32_t id : g.ids)
        for (int64_t j = 0; j < d; ++j)
          gE[id * d + j] = (touched[id] != 0.0f ? gE0[id * d + j] : 0.0f) + gb[id * d + j];
      for (int32_t id : g.ids) touched[id] = 1.0f;
      return Outputs{{"nrows", a.nrows}, {"inv_norm", a.inv_norm}, {"h_next", hn}, {"dmlp", dmlp}, {"ds", ds},
                     {"gE", gE}, {"touched", touched}};
    };
    c.gpu = [&](DType t) {
      return by_dtype(t, [&]<typename T>(T) {
        auto did = upload_exact(ids);
        DeviceDedup dd(did, N, V);
        auto dE = upload<T>(e), dhm = upload<T>(hm), dmo = upload<T>(mo), ds_ = upload<T>(sc), ddh = upload<T>(dh);
        auto dds = upload<float>(ds0), dgE = upload<float>(gE0);
        DeviceBuffer<T> nrows(N * d), hn(N * d), dmlp(N * d);
        JTOK_CUDA_CHECK(cudaMemset(dmlp.get(), 0xff, dmlp.n * sizeof(T)));  // NaN: every element must be written
        DeviceBuffer<float> inv(N), scratch(jtok::cuda::jtok_backward_scratch(N, d));
        std::vector<uint8_t> flags(V, 0);
        for (int64_t r = 0; r < V; r += 3) flags[r] = 1;
        auto touched = upload_exact(flags);
        jtok::cuda::jtok_prepare(nrows.get(), inv.get(), dE.get(), dd.rb, N, d, eps, norm, nullptr);
        jtok::cuda::jtok_forward(hn.get(), dhm.get(), dmo.get(), ds_.get(), nrows.get(), dd.rb, N, d, nullptr);
        jtok::cuda::jtok_backward(dmlp.get(), dds.get(), dgE.get(), touched.get(), scratch.get(), ddh.get(), dmo.get(),
                                  ds_.get(), dE.get(), nrows.get(), inv.get(), dd.rb, N, d, norm, nullptr);
        auto nr = download(nrows);
        nr.resize(static_cast<size_t>(U * d));
        auto iv = download(inv);
        iv.resize(static_cast<size_t>(U));
        const auto tb = download_exact(touched);
        return Outputs{{"nrows", nr}, {"inv_norm", iv}, {"h_next", download(hn)}, {"dmlp", download(dmlp)},
                       {"ds", download(dds)}, {"gE", download(dgE)}, {"touched", std::vector<float>(tb.begin(), tb.end())}};
      });
    };
    run_case(c);
    expect_deterministic(c, DType::bf16);
  }
}

}  // namespace
