// The token-table ops on the CPU through their real launchers (tests/cuda/emu), against the CPU
// engine's, as tests/cuda/test_cuda_tables.cpp's CudaOps.Embedding and CudaOps.Jtok. The device
// RowBatch is the CPU's dedup_ids copied up (dedup.cu's cub sort is not emulated; CudaOps.DedupIds
// checks on a GPU that it gives the same arrays).
#include <gtest/gtest.h>

#include <algorithm>

#include "cuda/embedding.h"
#include "cuda/jtok.h"
#include "cuda_case.h"
#include "emu_row_batch.h"
#include "model/jtok.h"
#include "model/token_table.h"
#include "ops/embedding.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

// Token embedding: the gather, and the backward both into the dense table gradient (accumulating
// onto a nonzero start) and as rows keyed by the unique ids.
TEST(EmulatedOps, Embedding) {
  const int64_t N = 500, V = 700, C = 40;
  const auto ids = skewed_ids(N, V, 91);
  const auto w = randn(V * C, 92), dy = randn(N * C, 93), dw0 = randn(V * C, 94, 0.1f);
  const jtok::RowBatch hb = jtok::dedup_ids(ids.data(), N, V);
  const int64_t U = static_cast<int64_t>(hb.unique.size());
  CudaCase c{"embedding", "N 500, V 700, C 40", {0, 1e-2}};  // fp32: the CPU's order of adds, bit for bit
  c.cpu = [&](DType t) {
    const auto wt = to_dtype(w, t), dyt = to_dtype(dy, t);
    std::vector<float> out(N * C), dw = dw0, rows(U * C, 0.0f), zero(V * C, 0.0f);
    jtok::embedding_forward(out.data(), ids.data(), wt.data(), N, C);
    jtok::embedding_backward(dw.data(), dyt.data(), ids.data(), N, C);
    jtok::embedding_backward(zero.data(), dyt.data(), ids.data(), N, C);
    for (int64_t u = 0; u < U; ++u) std::copy_n(zero.begin() + hb.unique[u] * C, C, rows.begin() + u * C);
    return Outputs{{"out", out}, {"dweight", dw}, {"rows", rows}};
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename T>(T) {
      auto did = upload_exact(ids);
      auto dw_ = upload<T>(w), ddy = upload<T>(dy);
      auto ddw = upload<float>(dw0);
      DeviceBuffer<T> out(N * C);
      DeviceBuffer<float> rows(N * C);
      const DeviceBatch b(hb);
      jtok::cuda::embedding_forward(out.get(), did.get(), dw_.get(), N, C, nullptr);
      jtok::cuda::embedding_backward(ddw.get(), ddy.get(), b.rb, N, C, nullptr);
      jtok::cuda::embedding_backward_rows(rows.get(), ddy.get(), b.rb, N, C, nullptr);
      auto r = download(rows);
      r.resize(static_cast<size_t>(U * C));
      return Outputs{{"out", download(out)}, {"dweight", download(ddw)}, {"rows", r}};
    });
  };
  run_case(c);
}

// JTok with and without the norm: prepare, the gate on the MLP update, and the backward (dmlp, ds
// accumulated, the table gradient accumulated onto a nonzero start at the touched rows, the touched
// flags), against src/model/jtok.cpp.
TEST(EmulatedOps, Jtok) {
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
      std::vector<float> gE = jtok::densify(g, V), touched(V, 0.0f);
      for (int64_t i = 0; i < V * d; ++i) gE[i] += gE0[i];
      for (int32_t id : g.ids) touched[id] = 1.0f;
      return Outputs{{"nrows", a.nrows}, {"inv_norm", a.inv_norm}, {"h_next", hn}, {"dmlp", dmlp}, {"ds", ds},
                     {"gE", gE}, {"touched", touched}};
    };
    c.gpu = [&](DType t) {
      return by_dtype(t, [&]<typename T>(T) {
        const DeviceBatch b(rb);
        auto dE = upload<T>(e), dhm = upload<T>(hm), dmo = upload<T>(mo), ds_ = upload<T>(sc), ddh = upload<T>(dh);
        auto dds = upload<float>(ds0), dgE = upload<float>(gE0);
        DeviceBuffer<T> nrows(N * d), hn(N * d), dmlp(N * d);
        DeviceBuffer<float> inv(N), scratch(jtok::cuda::jtok_backward_scratch(N, d));
        DeviceBuffer<uint8_t> touched(V);
        touched.zero();
        jtok::cuda::jtok_prepare(nrows.get(), inv.get(), dE.get(), b.rb, N, d, eps, norm, nullptr);
        jtok::cuda::jtok_forward(hn.get(), dhm.get(), dmo.get(), ds_.get(), nrows.get(), b.rb, N, d, nullptr);
        jtok::cuda::jtok_backward(dmlp.get(), dds.get(), dgE.get(), touched.get(), scratch.get(), ddh.get(), dmo.get(),
                                  ds_.get(), dE.get(), nrows.get(), inv.get(), b.rb, N, d, norm, nullptr);
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
