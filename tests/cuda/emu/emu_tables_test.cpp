// The token-table ops on the CPU through their real launchers (tests/cuda/emu), against the CPU
// engine's, as tests/cuda/test_cuda_tables.cpp's CudaOps.Embedding. The device RowBatch comes from
// the host (dedup.cu's cub sort is not emulated): sorted unique ids, positions grouped by id in
// increasing order, the same arrays dedup_ids must produce (CudaOps.DedupIds checks that on a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "cuda/embedding.h"
#include "cuda_case.h"
#include "ops/embedding.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

struct HostRowBatch {
  std::vector<int32_t> unique, inverse, offsets, order;
};

HostRowBatch host_dedup(const std::vector<int32_t>& ids) {
  std::map<int32_t, std::vector<int32_t>> at;
  for (size_t n = 0; n < ids.size(); ++n) at[ids[n]].push_back(static_cast<int32_t>(n));
  HostRowBatch b;
  b.inverse.resize(ids.size());
  b.offsets.push_back(0);
  for (const auto& [id, positions] : at) {
    for (int32_t n : positions) b.inverse[n] = static_cast<int32_t>(b.unique.size()), b.order.push_back(n);
    b.unique.push_back(id);
    b.offsets.push_back(static_cast<int32_t>(b.order.size()));
  }
  return b;
}

// The host batch on the device, arrays sized as dedup_ids' (N, N, N + 1, N, 1).
struct DeviceBatch {
  DeviceBuffer<int32_t> unique, inverse, offsets, order, count;
  jtok::cuda::DeviceRowBatch rb;
  explicit DeviceBatch(const HostRowBatch& h)
      : unique(upload_exact(padded(h.unique, h.inverse.size()))), inverse(upload_exact(h.inverse)),
        offsets(upload_exact(padded(h.offsets, h.inverse.size() + 1))), order(upload_exact(h.order)),
        count(upload_exact(std::vector<int32_t>{static_cast<int32_t>(h.unique.size())})),
        rb{unique.get(), inverse.get(), offsets.get(), order.get(), count.get()} {}
  static std::vector<int32_t> padded(std::vector<int32_t> v, size_t n) {
    v.resize(n, -1);  // past U: what the kernels must not read
    return v;
  }
};

// Token embedding: the gather, and the backward both into the dense table gradient (accumulating
// onto a nonzero start) and as rows keyed by the unique ids.
TEST(EmulatedOps, Embedding) {
  const int64_t N = 500, V = 700, C = 40;
  const auto ids = skewed_ids(N, V, 91);
  const auto w = randn(V * C, 92), dy = randn(N * C, 93), dw0 = randn(V * C, 94, 0.1f);
  const HostRowBatch hb = host_dedup(ids);
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

}  // namespace
