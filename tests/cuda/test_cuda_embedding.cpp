// The token embedding's gather and backward (cuda/embedding.h), the device RowBatch by dedup.cu,
// against the CPU's embedding ops (tests/cuda/cuda_case.h). Part of test_cuda_ops; also compiled
// unchanged by tests/cuda/emulate_kernels.sh (no GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cuda/dedup.h"
#include "cuda/embedding.h"
#include "cuda_case.h"
#include "model/token_table.h"
#include "ops/embedding.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

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

}  // namespace
