// The token-table CUDA ops against the CPU engine's (tests/cuda/cuda_case.h): deduplication and
// the touched-row list. The embedding, JTok, JTok-M and the table AdamW: test_cuda_embedding.cpp,
// test_cuda_jtok.cpp, test_cuda_jtokm.cpp, test_cuda_table_adamw.cpp. Part of test_cuda_ops.
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
