// The token-table CUDA ops against the CPU engine's (tests/cuda/cuda_case.h): deduplication, the
// token embedding, JTok's gather / norm / gate and their backward, the touched-row list. The table
// AdamW: test_cuda_table_adamw.cpp; JTok-M: test_cuda_jtokm.cpp. Part of test_cuda_ops
// (test_cuda_ops.cpp has the dense ops).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "cuda/dedup.h"
#include "cuda/embedding.h"
#include "cuda/gemm_ref.h"
#include "cuda/global_norm.h"
#include "cuda/jtok.h"
#include "cuda/jtokm.h"
#include "cuda/table_adamw.h"
#include "cuda/table_rows.h"
#include "cuda_case.h"
#include "device_dedup.h"
#include "model/jtok.h"
#include "model/jtokm.h"
#include "model/token_table.h"
#include "ops/adamw.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "train/table_optimizer.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;
using bf16 = __nv_bfloat16;

// Deduplication: the device RowBatch equals the CPU's dedup_ids exactly (sorted unique ids, their
// offsets, the positions in increasing order within an id, the inverse map).
TEST(CudaOps, DedupIds) {
  const int64_t N = 3000, V = 50304;
  const auto ids = skewed_ids(N, V, 81);
  const jtok::RowBatch want = jtok::dedup_ids(ids.data(), N, V);
  const int64_t U = static_cast<int64_t>(want.unique.size());
  ASSERT_LT(U, N / 2) << "the ids should repeat";
  auto did = upload_exact(ids);
  DeviceBuffer<int32_t> unique(N), inverse(N), offsets(N + 1), order(N), count(1);
  DeviceBuffer<char> scratch(jtok::cuda::dedup_scratch_bytes(N, V));
  const jtok::cuda::DeviceRowBatch rb{unique.get(), inverse.get(), offsets.get(), order.get(), count.get()};
  jtok::cuda::dedup_ids(rb, did.get(), N, V, scratch.get(), scratch.n, nullptr);
  ASSERT_EQ(download_exact(count)[0], U);
  auto head = [](std::vector<int32_t> v, int64_t n) { v.resize(static_cast<size_t>(n)); return v; };
  EXPECT_EQ(head(download_exact(unique), U), want.unique);
  EXPECT_EQ(head(download_exact(offsets), U + 1), want.offsets);
  EXPECT_EQ(download_exact(order), want.order);
  EXPECT_EQ(download_exact(inverse), want.inverse);
}

// Token embedding: the gather, and the backward both into the dense table gradient (accumulating
// onto a nonzero start) and as rows keyed by the unique ids, against the CPU's embedding ops.
TEST(CudaOps, Embedding) {
  const int64_t N = 500, V = 700, C = 40;
  const auto ids = skewed_ids(N, V, 91);
  const auto w = randn(V * C, 92), dy = randn(N * C, 93), dw0 = randn(V * C, 94, 0.1f);
  const jtok::RowBatch cpu_rb = jtok::dedup_ids(ids.data(), N, V);
  const int64_t U = static_cast<int64_t>(cpu_rb.unique.size());
  CudaCase c{"embedding", "N 500, V 700, C 40", {0, 1e-2}};  // fp32: the CPU's order of adds, bit for bit
  c.cpu = [&](DType t) {
    const auto wt = to_dtype(w, t), dyt = to_dtype(dy, t);
    std::vector<float> out(N * C), dw = dw0, rows(U * C, 0.0f);
    jtok::embedding_forward(out.data(), ids.data(), wt.data(), N, C);
    jtok::embedding_backward(dw.data(), dyt.data(), ids.data(), N, C);
    std::vector<float> zero(V * C, 0.0f);
    jtok::embedding_backward(zero.data(), dyt.data(), ids.data(), N, C);
    for (int64_t u = 0; u < U; ++u)
      std::copy_n(zero.begin() + cpu_rb.unique[u] * C, C, rows.begin() + u * C);
    return Outputs{{"out", out}, {"dweight", dw}, {"rows", rows}};
  };
  c.gpu = [&](DType t) {
    return by_dtype(t, [&]<typename T>(T) {
      auto did = upload_exact(ids);
      auto dw_ = upload<T>(w), ddy = upload<T>(dy);
      auto ddw = upload<float>(dw0);
      DeviceBuffer<T> out(N * C);
      DeviceBuffer<float> rows(N * C);
      DeviceBuffer<int32_t> unique(N), inverse(N), offsets(N + 1), order(N), count(1);
      DeviceBuffer<char> scratch(jtok::cuda::dedup_scratch_bytes(N, V));
      const jtok::cuda::DeviceRowBatch rb{unique.get(), inverse.get(), offsets.get(), order.get(), count.get()};
      jtok::cuda::dedup_ids(rb, did.get(), N, V, scratch.get(), scratch.n, nullptr);
      jtok::cuda::embedding_forward(out.get(), did.get(), dw_.get(), N, C, nullptr);
      jtok::cuda::embedding_backward(ddw.get(), ddy.get(), rb, N, C, nullptr);
      jtok::cuda::embedding_backward_rows(rows.get(), ddy.get(), rb, N, C, nullptr);
      auto r = download(rows);
      r.resize(static_cast<size_t>(U * C));
      return Outputs{{"out", download(out)}, {"dweight", download(ddw)}, {"rows", r}};
    });
  };
  run_case(c);
}

// JTok with and without the norm: prepare (normalised unique rows, 1/(||E||+eps)), the gate on the
// MLP update, and the backward (dmlp, ds accumulated, the table gradient accumulated onto a
// nonzero start at the touched rows, the touched flags), against src/model/jtok.cpp.
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
      std::vector<float> gE = jtok::densify(g, V), touched(V, 0.0f);
      for (int64_t i = 0; i < V * d; ++i) gE[i] += gE0[i];
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
        DeviceBuffer<float> inv(N), scratch(jtok::cuda::jtok_backward_scratch(N, d));
        DeviceBuffer<uint8_t> touched(V);
        touched.zero();
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

// The touched-row list (cuda/table_rows.h) and the norm's partials over it (cuda/global_norm.h):
// 900 rows (three tables of 300) with a third flagged and the gradient non-zero exactly there. The
// list is the flagged rows ascending; the flat chunks' and the listed rows' sum of squares is the
// host's (double) within fp32 rounding; clear_rows leaves every gradient and flag zero, and then
// nothing is listed.
TEST(CudaOps, TableRows) {
  constexpr int64_t R = 900, d = 40, flat = 5000;
  std::mt19937_64 rng(7);
  std::vector<uint8_t> flags(R, 0);
  std::vector<int32_t> want;
  std::vector<float> g = randn(R * d, 8);
  for (int64_t r = 0; r < R; ++r) {
    if (rng() % 3 == 0) {
      flags[r] = 1;
      want.push_back(static_cast<int32_t>(r));
    } else {
      std::fill_n(g.begin() + r * d, d, 0.0f);
    }
  }
  const std::vector<float> gflat = randn(flat, 9);
  double want_ss = 0;
  for (float x : gflat) want_ss += static_cast<double>(x) * x;
  for (float x : g) want_ss += static_cast<double>(x) * x;
  auto dg = upload<float>(g), dflat = upload<float>(gflat);
  auto dflags = upload_exact(flags);
  DeviceBuffer<int32_t> rows(R), count(1);
  DeviceBuffer<char> scratch(jtok::cuda::touched_rows_scratch_bytes(R));
  jtok::cuda::select_touched_rows(rows.get(), count.get(), dflags.get(), R, scratch.get(), scratch.n, nullptr);
  ASSERT_EQ(download_exact(count)[0], static_cast<int32_t>(want.size()));
  const auto listed = download_exact(rows);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), listed.begin())) << "the flagged rows, ascending";
  const int64_t chunks = jtok::cuda::sumsq_chunks(flat);
  DeviceBuffer<float> partials(static_cast<size_t>(chunks + R));
  DeviceBuffer<double> ss(1);
  jtok::cuda::sumsq_partials(partials.get(), dflat.get(), flat, nullptr);
  jtok::cuda::sumsq_rows_partials(partials.get() + chunks, dg.get(), rows.get(), count.get(), R, d, nullptr);
  jtok::cuda::sum_partials(ss.get(), partials.get(), chunks, nullptr, count.get());
  EXPECT_NEAR(download_exact(ss)[0], want_ss, 1e-5 * want_ss);  // fp32 partials
  jtok::cuda::clear_rows(dg.get(), dflags.get(), rows.get(), count.get(), R, d, nullptr);
  const auto g_after = download(dg);
  EXPECT_EQ(std::count(g_after.begin(), g_after.end(), 0.0f), R * d) << "the listed rows are zeroed";
  const auto flags_after = download_exact(dflags);
  EXPECT_EQ(std::count(flags_after.begin(), flags_after.end(), uint8_t{0}), R) << "the listed flags are cleared";
  jtok::cuda::select_touched_rows(rows.get(), count.get(), dflags.get(), R, scratch.get(), scratch.n, nullptr);
  EXPECT_EQ(download_exact(count)[0], 0);
}

}  // namespace
