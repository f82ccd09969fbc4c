// Deduplication (cuda/dedup.h) against src/model/token_table.h's dedup_ids (tests/cuda/cuda_case.h).
// Part of test_cuda_ops; also compiled unchanged by tests/cuda/emulate_kernels.sh (no GPU), beside
// tests/cuda/emu/emu_dedup_test.cpp's wider sweep of shapes.
#include <gtest/gtest.h>

#include <vector>

#include "cuda_case.h"
#include "device_dedup.h"
#include "model/token_table.h"

namespace {

using namespace jtok::cuda_test;

// Deduplication: the device RowBatch equals the CPU's dedup_ids exactly (sorted unique ids, their
// offsets, the positions in increasing order within an id, the inverse map).
TEST(CudaOps, DedupIds) {
  const int64_t N = 3000, V = 50304;
  const auto ids = skewed_ids(N, V, 81);
  const jtok::RowBatch want = jtok::dedup_ids(ids.data(), N, V);
  const int64_t U = static_cast<int64_t>(want.unique.size());
  // ~2500 distinct of 3000 (skewed_ids over V 50304): U < N / 2, as this said first, never held.
  ASSERT_LT(U, N) << "the ids should repeat";
  auto did = upload_exact(ids);
  const DeviceDedup dd(did, N, V);
  ASSERT_EQ(download_exact(dd.count)[0], U);
  auto head = [](std::vector<int32_t> v, int64_t n) { v.resize(static_cast<size_t>(n)); return v; };
  EXPECT_EQ(head(download_exact(dd.unique), U), want.unique);
  EXPECT_EQ(head(download_exact(dd.offsets), U + 1), want.offsets);
  EXPECT_EQ(download_exact(dd.order), want.order);
  EXPECT_EQ(download_exact(dd.inverse), want.inverse);
}

}  // namespace
