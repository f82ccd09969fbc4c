// `--device cuda`'s words about the device (src/cuda/device.h, device_require.cpp: every build has
// them): a build with the kernels records the architectures they are built for; a device they cannot
// run on is refused naming it, its sm, the architectures built and the CMake flag that builds for it
// (any other reason the runtime gives: named, no rebuild suggested); the description says which
// kernels the device runs, or that they do not. Plain C++: runs here.
#include <gtest/gtest.h>

#include <string>

#include "cuda/device.h"

namespace {

using jtok::cuda::DeviceInfo;

DeviceInfo a100() {
  DeviceInfo d;
  d.count = 1;
  d.name = "NVIDIA A100-SXM4-80GB";
  d.sm_count = 108;
  d.cc_major = 8;
  d.cc_minor = 0;
  d.memory_bytes = int64_t{80} << 30;
  d.driver_version = d.runtime_version = 13000;
  d.kernels_error = "cudaErrorNoKernelImageForDevice, no kernel image is available for execution on the device";
  return d;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(CudaDeviceInfo, ABuildWithTheKernelsRecordsTheirArchitectures) {
  EXPECT_EQ(jtok::cuda::built_cuda_archs().empty(), !jtok::cuda::built_with_cuda()) << jtok::cuda::built_cuda_archs();
}

TEST(CudaDeviceInfo, ADeviceTheKernelsCannotRunOnIsNamedWithTheFlagThatBuildsForIt) {
  const std::string one = jtok::cuda::kernels_cannot_run(a100(), "90a");
  EXPECT_TRUE(has(one,
                  "--device cuda: this jtok's kernels are built for sm_90a and cannot run on device 0, "
                  "NVIDIA A100-SXM4-80GB (sm_80): cudaErrorNoKernelImageForDevice"))
      << one;
  EXPECT_TRUE(has(one, "rebuild with -DCMAKE_CUDA_ARCHITECTURES=80")) << one;
  const std::string two = jtok::cuda::kernels_cannot_run(a100(), "86,90a");
  EXPECT_TRUE(has(two, "built for sm_86, sm_90a and")) << two;
  DeviceInfo busy = a100();  // another reason: no rebuild suggested
  busy.kernels_error = "cudaErrorDevicesUnavailable, CUDA-capable device(s) is/are busy or unavailable";
  const std::string other = jtok::cuda::kernels_cannot_run(busy, "90a");
  EXPECT_TRUE(has(other,
                  "device 0, NVIDIA A100-SXM4-80GB (sm_80), cannot run this jtok's kernels: "
                  "cudaErrorDevicesUnavailable"))
      << other;
  EXPECT_FALSE(has(other, "rebuild")) << other;
}

TEST(CudaDeviceInfo, TheDescriptionSaysWhichKernelsRunOnTheDevice) {
  DeviceInfo d = a100();
  const std::string refused = jtok::cuda::describe(d);
  EXPECT_TRUE(has(refused, "NVIDIA A100-SXM4-80GB, 108 SMs, 80.0 GiB, sm_80")) << refused;
  EXPECT_TRUE(has(refused, "(they do not run on it: cudaErrorNoKernelImageForDevice")) << refused;
  d.kernels_error.clear();
  const std::string runs = jtok::cuda::describe(d);
  const std::string archs = jtok::cuda::built_cuda_archs();
  EXPECT_TRUE(has(runs, "kernels for " + (archs.empty() ? std::string("an unrecorded architecture") : "sm_"))) << runs;
  EXPECT_FALSE(has(runs, "do not run")) << runs;
  DeviceInfo none;
  none.runtime_version = 13000;
  EXPECT_TRUE(has(jtok::cuda::describe(none), "no CUDA device (driver version 0, runtime version 13.0"))
      << jtok::cuda::describe(none);
}

}  // namespace
