// The device probe (cuda/device.h) finds the GPU and reads its properties. Part of test_cuda_ops,
// on a GPU host only (the emulation has no device to probe).
#include <gtest/gtest.h>

#include <cstdio>

#include "cuda/device.h"

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
