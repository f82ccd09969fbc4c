// The emulator's launch checks (tests/cuda/emu/emu_sched.cpp), on a kernel written here: a block
// past the kernel's __launch_bounds__ (cu2cpp.py passes every src/cuda kernel's as Config::bounded)
// is refused with cudaErrorLaunchOutOfResources and does not run, as on the GPU (ptxas fits the
// registers to the bound); a block within it runs every thread; a block past 1024 threads is an
// invalid configuration whatever the bound.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

namespace {

void count_threads(int* n) { ++*n; }  // atomics are plain here: fibers switch at barriers only

int launch_and_count(unsigned threads, unsigned bound, cudaError_t& error) {
  int n = 0;
  ::emu::launch(::emu::config(1, threads).bounded(bound), "count_threads", count_threads, &n);
  error = cudaGetLastError();
  cudaDeviceSynchronize();  // with EMU_STREAMS=lazy the launch runs here
  return n;
}

TEST(EmulatedLaunch, BlockPastItsLaunchBoundsIsRefused) {
  cudaError_t e = cudaSuccess;
  EXPECT_EQ(launch_and_count(256, 128, e), 0) << "a refused launch ran";
  EXPECT_EQ(e, cudaErrorLaunchOutOfResources);
  EXPECT_EQ(launch_and_count(128, 128, e), 128);
  EXPECT_EQ(e, cudaSuccess);
  EXPECT_EQ(launch_and_count(96, 128, e), 96);
  EXPECT_EQ(e, cudaSuccess);
  EXPECT_EQ(launch_and_count(2048, 4096, e), 0);
  EXPECT_EQ(e, cudaErrorInvalidConfiguration);
}

}  // namespace
