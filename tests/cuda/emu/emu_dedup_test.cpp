// dedup.cu and table_rows.cu on the CPU through their real launchers (tests/cuda/emu), their cub
// calls run by the fake tests/cuda/emu/include/cub/emu_cub.h: the device RowBatch against
// src/model/token_table.h's dedup_ids over a sweep of shapes (the GPU test's one shape,
// CudaOps.DedupIds, runs here too, from test_cuda_dedup.cpp), and the identity batch's positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "cuda/dedup.h"
#include "cuda_case.h"
#include "device_dedup.h"
#include "model/token_table.h"

namespace {

using namespace jtok::cuda_test;

std::vector<int32_t> head(std::vector<int32_t> v, int64_t n) {
  v.resize(static_cast<size_t>(n));
  return v;
}

// dedup_ids on ids (N) below V equals the CPU's, array for array; offsets past U are N.
void expect_dedup_matches(const std::vector<int32_t>& ids, int64_t V, const std::string& what) {
  SCOPED_TRACE(what);
  const int64_t N = static_cast<int64_t>(ids.size());
  const jtok::RowBatch want = jtok::dedup_ids(ids.data(), N, V);
  const int64_t U = static_cast<int64_t>(want.unique.size());
  auto did = upload_exact(ids);
  const DeviceDedup dd(did, N, V);
  ASSERT_EQ(download_exact(dd.count)[0], U);
  EXPECT_EQ(head(download_exact(dd.unique), U), want.unique);
  const auto off = download_exact(dd.offsets);
  EXPECT_EQ(head(off, U + 1), want.offsets);
  EXPECT_TRUE(std::all_of(off.begin() + U + 1, off.end(), [&](int32_t o) { return o == N; })) << "offsets past U";
  EXPECT_EQ(download_exact(dd.order), want.order);
  EXPECT_EQ(download_exact(dd.inverse), want.inverse);
}

// Random ids with repeats (uniform and skewed), N 1 to 1000, V up to 50304; all-distinct ids
// (a permutation); one id repeated N times.
TEST(EmulatedOps, DedupIds) {
  std::mt19937_64 rng(81);
  for (int64_t N : {1, 2, 3, 17, 256, 1000})
    for (int64_t V : {1, 7, 1000, 50304}) {
      std::vector<int32_t> ids(static_cast<size_t>(N));
      for (auto& id : ids) id = static_cast<int32_t>(rng() % V);
      expect_dedup_matches(ids, V, "uniform N " + std::to_string(N) + " V " + std::to_string(V));
      expect_dedup_matches(skewed_ids(N, V, rng()), V, "skewed N " + std::to_string(N) + " V " + std::to_string(V));
    }
  std::vector<int32_t> perm(1000);
  for (int32_t i = 0; i < 1000; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  expect_dedup_matches(perm, 1000, "a permutation of 0..999");
  expect_dedup_matches(std::vector<int32_t>(1000, 50303), 50304, "one id 1000 times");
}

// The identity batch: positions 0..N and the count N.
TEST(EmulatedOps, FillPositions) {
  for (int64_t N : {1, 255, 256, 257, 1000}) {
    DeviceBuffer<int32_t> positions(N + 1), count(1);
    jtok::cuda::fill_positions(positions.get(), count.get(), N, nullptr);
    std::vector<int32_t> want(static_cast<size_t>(N + 1));
    for (int64_t i = 0; i <= N; ++i) want[i] = static_cast<int32_t>(i);
    EXPECT_EQ(download_exact(positions), want) << "N " << N;
    EXPECT_EQ(download_exact(count)[0], N);
  }
}

}  // namespace
