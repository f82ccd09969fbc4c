// EMU_DIGEST=file: each case's line "Suite.Name hash" appended to file, the hash of what its copies
// wrote to host memory (emu_runtime.h's host_copy_digest). emulate_kernels.sh runs the CI set in
// both thread orders (EMU_ORDER, emu_sched.cpp) and requires the same hash of every case: the
// GPU's kernels give the same bits whichever thread or block runs first (docs/cuda.md).
// EMU_LAUNCHES=file: each case's kernels and cuBLASLt products.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "emu_runtime.h"

namespace {

class DigestListener : public testing::EmptyTestEventListener {
 public:
  explicit DigestListener(std::FILE* out) : out_(out) {}
  void OnTestStart(const testing::TestInfo&) override { emu::reset_host_copy_digest(); }
  void OnTestEnd(const testing::TestInfo& t) override {
    std::fprintf(out_, "%s.%s %016llx\n", t.test_suite_name(), t.name(),
                 static_cast<unsigned long long>(emu::host_copy_digest()));
    std::fflush(out_);
  }

 private:
  std::FILE* out_;
};

// EMU_LAUNCHES=file: each case's line "Suite.Name kernels K products P" (emu_runtime.h's
// work_counts): the launches a fusion saves, counted on the cases that run it.
class LaunchListener : public testing::EmptyTestEventListener {
 public:
  explicit LaunchListener(std::FILE* out) : out_(out) {}
  void OnTestStart(const testing::TestInfo&) override { emu::work_counts() = {}; }
  void OnTestEnd(const testing::TestInfo& t) override {
    const emu::WorkCounts& w = emu::work_counts();
    std::fprintf(out_, "%s.%s kernels %llu products %llu\n", t.test_suite_name(), t.name(),
                 static_cast<unsigned long long>(w.kernels), static_cast<unsigned long long>(w.products));
    std::fflush(out_);
  }

 private:
  std::FILE* out_;
};

// A listener writing to the file env names (appended), registered before main (gtest_main) runs
// the cases; the listener list owns it.
template <typename Listener>
bool register_listener(const char* env) {
  const char* path = std::getenv(env);
  if (!path) return false;
  std::FILE* out = std::fopen(path, "a");
  if (!out) {
    std::fprintf(stderr, "%s=%s: cannot open it for appending\n", env, path);
    std::exit(2);
  }
  testing::UnitTest::GetInstance()->listeners().Append(new Listener(out));
  return true;
}
const bool g_digests = register_listener<DigestListener>("EMU_DIGEST");
const bool g_launches = register_listener<LaunchListener>("EMU_LAUNCHES");

// The hash follows what reaches the host: a different byte, a different hash.
TEST(EmulatedDigest, FollowsTheBytesCopiedToTheHost) {
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), 4 * sizeof(float)), cudaSuccess);
  float host[4] = {1, 2, 3, 4}, back[4] = {};
  auto digest_of_round_trip = [&] {
    emu::reset_host_copy_digest();
    EXPECT_EQ(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(emu::host_copy_digest(), 0u);  // a copy to the device is not hashed
    EXPECT_EQ(cudaMemcpy(back, dev, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    return emu::host_copy_digest();
  };
  const uint64_t a = digest_of_round_trip(), b = digest_of_round_trip();
  host[2] = 3.5f;
  const uint64_t c = digest_of_round_trip();
  EXPECT_NE(a, 0u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  cudaFree(dev);
}

// out[t] = the neighbour's s[t + 1], each thread's s[t] = base + t written first; with or without
// the barrier between (without: a race on the GPU).
void read_neighbour(float* out, float base, bool barrier) {
  __shared__ float s[64];
  const int t = static_cast<int>(threadIdx.x);
  s[t] = base + static_cast<float>(t);
  if (barrier) __syncthreads();
  out[t] = s[(t + 1) % 64];
}

std::vector<float> run_read_neighbour(bool reverse, float base, bool barrier) {
  const bool was = emu::set_reverse_order(reverse);
  float* dev = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), 64 * sizeof(float)), cudaSuccess);
  emu::launch(emu::config(1, 64), "read_neighbour", &read_neighbour, dev, base, barrier);
  std::vector<float> out(64);
  EXPECT_EQ(cudaMemcpy(out.data(), dev, 64 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dev);
  emu::set_reverse_order(was);
  return out;
}

// The two orders agree on a kernel with its barrier and disagree on the same kernel without it.
TEST(EmulatedOrder, AMissingBarrierGivesEachOrderItsOwnBits) {
  std::vector<float> want(64);
  for (int t = 0; t < 64; ++t) want[t] = 100.0f + static_cast<float>((t + 1) % 64);
  EXPECT_EQ(run_read_neighbour(false, 100.0f, true), want);
  EXPECT_EQ(run_read_neighbour(true, 100.0f, true), want);
  const std::vector<float> forward = run_read_neighbour(false, 200.0f, false);
  const std::vector<float> reverse = run_read_neighbour(true, 300.0f, false);
  int forward_stale = 0, reverse_stale = 0;
  for (int t = 0; t < 64; ++t) {
    forward_stale += forward[t] != 200.0f + static_cast<float>((t + 1) % 64);
    reverse_stale += reverse[t] != 300.0f + static_cast<float>((t + 1) % 64);
  }
  EXPECT_EQ(forward_stale, 63);  // every thread but the last reads before its neighbour writes
  EXPECT_EQ(reverse_stale, 1);   // only the last: thread 0 runs after it
}

// work_counts: a grid is one kernel however many threads it has; a copy is no kernel.
TEST(EmulatedDigest, CountsEachGridOnce) {
  emu::work_counts() = {};
  run_read_neighbour(false, 1.0f, true);
  run_read_neighbour(true, 1.0f, true);
  EXPECT_EQ(emu::work_counts().kernels, 2u);
  EXPECT_EQ(emu::work_counts().products, 0u);
}

}  // namespace
