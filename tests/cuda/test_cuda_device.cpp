// The device probe (cuda/device.h) finds the GPU, reads its properties and finds this build's kernels
// runnable on it; the device-memory count behind the benches' peak memory follows DeviceArray's
// allocations; a failed CUDA call throws jtok::DeviceLost for the sticky errors (cuda/check.h) and a
// plain jtok::Error for the others; bench-peak's measurements (cuda/device_peak.h) check their products. Part of
// test_cuda_ops, on a GPU host, and of the emulation (tests/cuda/emulate_kernels.sh).
#include <gtest/gtest.h>

#include <cstdio>

#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/device_array.h"
#include "cuda/device_peak.h"

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
  EXPECT_EQ(d.kernels_error, "");  // this build's kernels run on it
  const std::string line = jtok::cuda::describe(d);
  EXPECT_NE(line.find("kernels for sm_"), std::string::npos) << line;  // the build recorded its architectures
}

TEST(CudaDevice, MemoryCountFollowsAllocations) {
  using jtok::cuda::device_bytes_now;
  using jtok::cuda::device_bytes_peak;
  const int64_t before = device_bytes_now();
  {
    jtok::cuda::DeviceArray<float> a(1 << 20);
    EXPECT_EQ(device_bytes_now(), before + (4 << 20));
    a.resize(1 << 18);  // freed, then 1 MiB
    EXPECT_EQ(device_bytes_now(), before + (1 << 20));
    jtok::cuda::DeviceArray<double> b(1 << 18);
    jtok::cuda::DeviceArray<float> c(std::move(a));  // a move holds the same memory
    EXPECT_EQ(device_bytes_now(), before + (3 << 20));
    EXPECT_GE(device_bytes_peak(), before + (4 << 20));
  }
  EXPECT_EQ(device_bytes_now(), before);
}

// What JTOK_CUDA_CHECK throws for e: "lost" (DeviceLost), "error" (another Error) or "none"; msg its text.
std::string thrown(cudaError_t e, std::string* msg = nullptr) {
  try {
    JTOK_CUDA_CHECK(e);
  } catch (const jtok::DeviceLost& x) {
    if (msg) *msg = x.what();
    return "lost";
  } catch (const jtok::Error& x) {
    if (msg) *msg = x.what();
    return "error";
  }
  return "none";
}

TEST(CudaDevice, StickyErrorsAreDeviceLost) {
  for (cudaError_t e : {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorMisalignedAddress,
                        cudaErrorIllegalInstruction, cudaErrorECCUncorrectable, cudaErrorAssert})
    EXPECT_EQ(thrown(e), "lost") << cudaGetErrorName(e);
  for (cudaError_t e : {cudaErrorInvalidValue, cudaErrorMemoryAllocation, cudaErrorInvalidConfiguration})
    EXPECT_EQ(thrown(e), "error") << cudaGetErrorName(e);
  EXPECT_EQ(thrown(cudaSuccess), "none");
  std::string msg;
  thrown(cudaErrorIllegalAddress, &msg);
  EXPECT_NE(msg.find("cudaErrorIllegalAddress"), std::string::npos) << msg;
  EXPECT_NE(msg.find("restart the process"), std::string::npos) << msg;
  EXPECT_NE(msg.find("test_cuda_device.cpp"), std::string::npos) << msg;  // the call's place
}

// bench-peak --device cuda's products are checked (a wrong one is an error, never a figure), its copies
// timed, its bad sizes refused by name.
TEST(CudaDevice, PeaksComeFromCheckedProducts) {
  const jtok::cuda::DevicePeaks p = jtok::cuda::measure_device_peaks({{40, 24, 32}, {17, 50, 200}}, 4096, 2);
  ASSERT_EQ(p.products.size(), 2u);
  EXPECT_EQ(p.products[1].M, 17);
  EXPECT_EQ(p.products[1].N, 50);
  EXPECT_EQ(p.products[1].K, 200);
  for (const jtok::cuda::PeakProduct& q : p.products) {
    EXPECT_GT(q.ms, 0);
    EXPECT_GT(q.tflops, 0);
    EXPECT_LE(q.max_rel_error, 1.0 / 256);  // exact fp32 sums, rounded once to bf16
  }
  EXPECT_EQ(p.copy_bytes, 4096);
  EXPECT_GT(p.device_copy_gbs, 0);
  EXPECT_GT(p.h2d_gbs, 0);
  EXPECT_GT(p.d2h_gbs, 0);

  jtok::cuda::DeviceArray<uint16_t> zeros(17 * 50);  // a product that never ran: bf16 zeros
  zeros.zero(nullptr);
  JTOK_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_GT(jtok::cuda::sampled_product_error(zeros.get(), 17, 50, 200), 0.5);

  std::string msg;
  try {
    jtok::cuda::measure_device_peaks({{8, 8, 1 << 18}}, 0, 1);
  } catch (const jtok::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("K below 2^18"), std::string::npos) << msg;
  EXPECT_THROW(jtok::cuda::measure_device_peaks({}, 0, 0), jtok::Error);
}

}  // namespace
