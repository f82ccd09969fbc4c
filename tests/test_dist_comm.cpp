// src/dist/communicator: alone (ctest runs it without mpirun: a world of one, no MPI) and under
// `mpirun -np 2` (tests/test_dist_comm.sh). Every check computes the expected result from data all
// ranks can regenerate (a seed per rank), so the same assertions hold for any world size.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "dist/communicator.h"

using namespace jtok;

namespace {

struct DistEnv : ::testing::Environment {
  void SetUp() override { dist::init(nullptr, nullptr); }
  void TearDown() override { dist::finalize(); }
};
const auto* env = ::testing::AddGlobalTestEnvironment(new DistEnv);

std::vector<float> rank_data(int r, int64_t n) {
  std::mt19937 g(1000u + static_cast<unsigned>(r));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(g) * (1.0f + static_cast<float>(r));
  return v;
}

}  // namespace

TEST(DistComm, WorldShape) {
  EXPECT_GE(dist::world_size(), 1);
  EXPECT_GE(dist::rank(), 0);
  EXPECT_LT(dist::rank(), dist::world_size());
  EXPECT_EQ(dist::active(), dist::launched_by_mpi());
  if (!dist::launched_by_mpi()) {
    EXPECT_EQ(dist::world_size(), 1);
  }
}

// The sum is ((x_0 + x_1) + x_2) ... in rank order, bit for bit, on every rank; sizes that do not
// divide by P, and fewer elements than ranks, included.
TEST(DistComm, AllreduceSumIsRankOrderSum) {
  const int P = dist::world_size();
  for (int64_t n : {1, 3, 1000, 4099}) {
    std::vector<float> mine = rank_data(dist::rank(), n);
    std::vector<float> want = rank_data(0, n);
    for (int r = 1; r < P; ++r) {
      std::vector<float> o = rank_data(r, n);
      for (int64_t i = 0; i < n; ++i) want[i] = want[i] + o[i];
    }
    dist::allreduce_sum(mine.data(), n);
    ASSERT_EQ(0, std::memcmp(mine.data(), want.data(), sizeof(float) * n)) << "n=" << n;
    std::vector<double> d(static_cast<size_t>(n)), dw(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < n; ++i) d[i] = 0.5 * (dist::rank() + 1) + i;
    for (int r = 0; r < P; ++r)
      for (int64_t i = 0; i < n; ++i) dw[i] += 0.5 * (r + 1) + i;
    dist::allreduce_sum(d.data(), n);
    ASSERT_EQ(d, dw);
  }
  int64_t c[2] = {dist::rank(), 1};
  dist::allreduce_sum(c, 2);
  EXPECT_EQ(c[0], static_cast<int64_t>(P) * (P - 1) / 2);
  EXPECT_EQ(c[1], P);
  double m = 10.0 * dist::rank();
  dist::allreduce_max(&m, 1);
  EXPECT_EQ(m, 10.0 * (P - 1));
}

// Rank r sends (r + 1) * (j + 1) int32 values "r*100 + j" to rank j (0 bytes for nothing included
// when P > 2 would make it so: rank 0 sends nothing to itself).
TEST(DistComm, AlltoallvDeliversEachBlock) {
  const int P = dist::world_size(), me = dist::rank();
  std::vector<int64_t> sc(P);
  for (int j = 0; j < P; ++j) sc[j] = (me == 0 && j == 0 && P > 1) ? 0 : int64_t((me + 1) * (j + 1)) * 4;
  std::vector<int64_t> so = dist::prefix_offsets(sc);
  std::vector<int32_t> send(static_cast<size_t>((so.back() + sc.back()) / 4));
  for (int j = 0; j < P; ++j)
    for (int64_t i = 0; i < sc[j] / 4; ++i) send[so[j] / 4 + i] = me * 100 + j;
  std::vector<int64_t> rc = dist::exchange_counts(sc);
  for (int j = 0; j < P; ++j)
    EXPECT_EQ(rc[j], (j == 0 && me == 0 && P > 1) ? 0 : int64_t((j + 1) * (me + 1)) * 4) << "from " << j;
  std::vector<int64_t> ro = dist::prefix_offsets(rc);
  std::vector<int32_t> recv(static_cast<size_t>((ro.back() + rc.back()) / 4), -1);
  dist::alltoallv(send.data(), sc, so, recv.data(), rc, ro);
  for (int j = 0; j < P; ++j)
    for (int64_t i = 0; i < rc[j] / 4; ++i) ASSERT_EQ(recv[ro[j] / 4 + i], j * 100 + me);
}

TEST(DistComm, AllgathervConcatenatesInRankOrder) {
  const int P = dist::world_size(), me = dist::rank();
  std::string mine(static_cast<size_t>(me + 1), static_cast<char>('a' + me));
  std::vector<int64_t> sizes;
  std::vector<char> all = dist::allgatherv(mine.data(), static_cast<int64_t>(mine.size()), &sizes);
  std::string want;
  for (int r = 0; r < P; ++r) want += std::string(static_cast<size_t>(r + 1), static_cast<char>('a' + r));
  EXPECT_EQ(std::string(all.begin(), all.end()), want);
  ASSERT_EQ(sizes.size(), static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) EXPECT_EQ(sizes[r], r + 1);
  int64_t v = me == 0 ? 77 : -1;
  dist::broadcast(&v, sizeof v, 0);
  EXPECT_EQ(v, 77);
  dist::barrier();
}
