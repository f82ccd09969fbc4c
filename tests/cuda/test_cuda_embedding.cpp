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
void embedding_case(const std::string& name, const std::vector<int32_t>& ids, int64_t V, float fp32_tol) {
  const int64_t N = static_cast<int64_t>(ids.size()), C = 40;
  const auto w = randn(V * C, 92), dy = randn(N * C, 93), dw0 = randn(V * C, 94, 0.1f);
  const jtok::RowBatch cpu_rb = jtok::dedup_ids(ids.data(), N, V);
  const int64_t U = static_cast<int64_t>(cpu_rb.unique.size());
  CudaCase c{name, "N " + std::to_string(N) + ", V " + std::to_string(V) + ", C 40", {fp32_tol, 1e-2}};
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
      DeviceBuffer<float> hot(jtok::cuda::embedding_backward_scratch(N, C));
      const jtok::cuda::DeviceRowBatch rb{unique.get(), inverse.get(), offsets.get(), order.get(), count.get()};
      jtok::cuda::dedup_ids(rb, did.get(), N, V, scratch.get(), scratch.n, nullptr);
      jtok::cuda::embedding_forward(out.get(), did.get(), dw_.get(), N, C, nullptr);
      jtok::cuda::embedding_backward(ddw.get(), ddy.get(), rb, N, C, hot.get(), nullptr);
      jtok::cuda::embedding_backward_rows(rows.get(), ddy.get(), rb, N, C, hot.get(), nullptr);
      auto r = download(rows);
      r.resize(static_cast<size_t>(U * C));
      return Outputs{{"out", download(out)}, {"dweight", download(ddw)}, {"rows", r}};
    });
  };
  run_case(c);
}

// Ids of at most kHotChunk positions each: the backward adds every id's positions in the CPU's order,
// bit for bit in fp32. Skewed ids (id 0 at ~56 of 500 positions, hot: cuda/hot_ids.cuh): a hot id's
// positions in pieces of a chunk each, within fp32 rounding of the CPU's order.
TEST(CudaOps, Embedding) {
  std::vector<int32_t> cold(500);
  for (size_t n = 0; n < cold.size(); ++n) cold[n] = static_cast<int32_t>((n * 37) % 23);  // ~22 positions an id
  embedding_case("embedding", cold, 700, 0);
  const auto skewed = skewed_ids(500, 700, 91);
  ASSERT_GT(std::count(skewed.begin(), skewed.end(), 0), jtok::cuda::kHotChunk);
  embedding_case("embedding hot ids", skewed, 700, 1e-6f);
  // Three chunks and more of one id, pieces at both ends of a chunk (two hot ids meet mid-chunk).
  std::vector<int32_t> two(300);
  for (size_t n = 0; n < two.size(); ++n) two[n] = n % 3 == 0 ? 5 : (n % 7 == 0 ? 9 : 2);
  embedding_case("embedding two hot ids", two, 700, 1e-6f);
}

}  // namespace
