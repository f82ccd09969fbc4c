// dedup.cu and table_rows.cu on the CPU through their real launchers (tests/cuda/emu), their cub
// calls run by the fake tests/cuda/emu/include/cub/emu_cub.h: the device RowBatch against
// src/model/token_table.h's dedup_ids (as the GPU test CudaOps.DedupIds), the identity batch's
// positions, and the touched-row list with the norm's partials over it and the clearing (as
// CudaOps.TableRows).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "cuda/dedup.h"
#include "cuda/global_norm.h"
#include "cuda/table_rows.h"
#include "cuda_case.h"
#include "model/token_table.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

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
  DeviceBuffer<int32_t> unique(N), inverse(N), offsets(N + 1), order(N), count(1);
  DeviceBuffer<char> scratch(jtok::cuda::dedup_scratch_bytes(N, V));
  const jtok::cuda::DeviceRowBatch rb{unique.get(), inverse.get(), offsets.get(), order.get(), count.get()};
  jtok::cuda::dedup_ids(rb, did.get(), N, V, scratch.get(), scratch.n, nullptr);
  ASSERT_EQ(download_exact(count)[0], U);
  EXPECT_EQ(head(download_exact(unique), U), want.unique);
  const auto off = download_exact(offsets);
  EXPECT_EQ(head(off, U + 1), want.offsets);
  EXPECT_TRUE(std::all_of(off.begin() + U + 1, off.end(), [&](int32_t o) { return o == N; })) << "offsets past U";
  EXPECT_EQ(download_exact(order), want.order);
  EXPECT_EQ(download_exact(inverse), want.inverse);
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

// 900 rows with a third flagged and the gradient non-zero exactly there: the list is the flagged
// rows ascending; the flat chunks' and the listed rows' sum of squares is the host's (double)
// within fp32 rounding; clear_rows leaves every gradient and flag zero, and then nothing is listed.
TEST(EmulatedOps, TableRows) {
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
  EXPECT_EQ(head(download_exact(rows), static_cast<int64_t>(want.size())), want) << "the flagged rows, ascending";
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
