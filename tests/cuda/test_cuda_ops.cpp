// CUDA kernels against the CPU engine's own ops (tests/cuda/cuda_case.h), forward and backward,
// fp32 and bf16. Runs only on a GPU host (registered with label cuda when CMake found a GPU;
// bash scripts/test_cuda.sh), compiled and linked everywhere the toolkit is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "cuda/device.h"
#include "cuda_case.h"

namespace {

TEST(CudaDevice, ProbeFindsTheGpu) {
  const jtok::cuda::DeviceInfo d = jtok::cuda::device_info();
  std::printf("device: %s\n", jtok::cuda::describe(d).c_str());
  ASSERT_GT(d.count, 0) << d.error;
  EXPECT_GT(d.sm_count, 0);
  EXPECT_GT(d.memory_bytes, 0);
  EXPECT_GT(d.driver_version, 0);
  EXPECT_GT(d.runtime_version, 0);
  EXPECT_GT(d.bf16_peak_tflops, 0) << d.peak_how;
}

}  // namespace
