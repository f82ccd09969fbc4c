// The touched-row list (cuda/table_rows.h), the norm's partials over it (cuda/global_norm.h) and
// the clearing, against the host (tests/cuda/cuda_case.h). Part of test_cuda_ops; also compiled
// unchanged by tests/cuda/emulate_kernels.sh (no GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cuda/global_norm.h"
#include "cuda/table_rows.h"
#include "cuda_case.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

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

// touched_positions (the side streams' per-layer spans of the list) against std::lower_bound: a list of
// 700 ascending rows with gaps, values below, between, on and past its rows, an empty list (every
// answer 0), and a span's rows are the list's rows in [a, b).
TEST(CudaOps, TouchedPositionsAreLowerBounds) {
  std::mt19937_64 rng(13);
  std::vector<int32_t> list;
  for (int32_t r = 5; list.size() < 700; r += 1 + static_cast<int32_t>(rng() % 4)) list.push_back(r);
  std::vector<int32_t> values = {0, 5, 6, list.back(), list.back() + 1, 1 << 30};
  for (int i = 0; i < 200; ++i) values.push_back(static_cast<int32_t>(rng() % (list.back() + 10)));
  auto drows = upload_exact(list), dvalues = upload_exact(values);
  DeviceBuffer<int32_t> pos(values.size());
  for (const int32_t n : {static_cast<int32_t>(list.size()), 0}) {
    auto count = upload_exact(std::vector<int32_t>{n});
    jtok::cuda::touched_positions(pos.get(), drows.get(), count.get(), dvalues.get(),
                                  static_cast<int64_t>(values.size()), nullptr);
    const auto got = download_exact(pos);
    for (size_t i = 0; i < values.size(); ++i)
      EXPECT_EQ(got[i], std::lower_bound(list.begin(), list.begin() + n, values[i]) - list.begin())
          << "value " << values[i] << ", " << n << " rows listed";
  }
}

// Each listed row's partial (a warp a row) against the host's sum of squares of that row: 20,000
// rows of 33 (more rows than the launch's warps, so warps stride on; lanes with one or two
// elements), every other one listed.
TEST(CudaOps, TableRowsNormPartialEachRow) {
  constexpr int64_t R = 40000, d = 33;
  std::vector<uint8_t> flags(R, 0);
  for (int64_t r = 0; r < R; r += 2) flags[r] = 1;
  const std::vector<float> g = randn(R * d, 11);
  auto dg = upload<float>(g);
  auto dflags = upload_exact(flags);
  DeviceBuffer<int32_t> rows(R), count(1);
  DeviceBuffer<char> scratch(jtok::cuda::touched_rows_scratch_bytes(R));
  jtok::cuda::select_touched_rows(rows.get(), count.get(), dflags.get(), R, scratch.get(), scratch.n, nullptr);
  ASSERT_EQ(download_exact(count)[0], static_cast<int32_t>(R / 2));
  DeviceBuffer<float> partials(static_cast<size_t>(R));
  jtok::cuda::sumsq_rows_partials(partials.get(), dg.get(), rows.get(), count.get(), R, d, nullptr);
  const auto got = download_exact(partials);
  int64_t off = 0;
  for (int64_t i = 0; i < R / 2; ++i) {
    double want = 0;
    for (int64_t j = 0; j < d; ++j) want += static_cast<double>(g[2 * i * d + j]) * g[2 * i * d + j];
    off += std::abs(got[static_cast<size_t>(i)] - want) > 1e-5 * want + 1e-7;
  }
  EXPECT_EQ(off, 0) << "listed rows whose partial is not their sum of squares";
}

}  // namespace
