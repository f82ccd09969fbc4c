// Device probe: count, device 0's properties, its dense bf16 peak (MFU denominator), and the
// driver / runtime versions. Never throws for a machine without a driver or a GPU.
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "cuda/device.h"
#include "cuda/pdl.cuh"

namespace jtok::cuda {

namespace {

// Dense bf16 tensor-core FLOP per SM per clock (fp32 accumulate), by compute capability: Hopper
// 4096 (989 TFLOP/s = 132 SMs x 1.83 GHz x 4096), Ampere A100 2048 (312 = 108 x 1.41 x 2048),
// Ada / consumer Ampere 1024, Blackwell datacenter 8192; 0 where not known.
double bf16_flop_per_sm_clock(int major, int minor) {
  if (major == 9) return 4096;
  if (major == 8 && minor == 0) return 2048;
  if (major == 8) return 1024;
  if (major == 10) return 8192;
  return 0;
}

// The datasheet's dense bf16 peak for the GPUs this project measures on: H100 SXM and H200 (132
// SMs) 989 TFLOP/s; other parts get SMs x peak clock x the per-SM rate (the datasheets quote a
// lower sustained boost clock, so this over-estimates by ~8 % on Hopper).
void set_bf16_peak(DeviceInfo& d) {
  const bool hopper_sxm = (std::strstr(d.name.c_str(), "H100") || std::strstr(d.name.c_str(), "H200")) &&
                          d.sm_count == 132;
  if (hopper_sxm) {
    d.bf16_peak_tflops = 989;
    d.peak_how = "datasheet, dense";
    return;
  }
  const double rate = bf16_flop_per_sm_clock(d.cc_major, d.cc_minor);
  d.bf16_peak_tflops = d.sm_count * (d.clock_khz * 1e3) * rate / 1e12;
  d.peak_how = rate > 0 ? "SMs x peak clock x " + std::to_string(static_cast<int>(rate)) + " FLOP/SM/clock"
                        : "unknown architecture";
}

// The kernel device_info asks the runtime for: found where the build has code for the device.
__global__ void __launch_bounds__(32) probe_kernel() { pdl_wait(); }

}  // namespace

DeviceInfo device_info() {
  DeviceInfo d;
  if (cudaDriverGetVersion(&d.driver_version) != cudaSuccess) d.driver_version = 0;
  if (cudaRuntimeGetVersion(&d.runtime_version) != cudaSuccess) d.runtime_version = 0;
  const cudaError_t e = cudaGetDeviceCount(&d.count);
  if (e != cudaSuccess) {
    d.count = 0;
    d.error = cudaGetErrorName(e);
    cudaGetLastError();  // clear it: later calls would report it again
    return d;
  }
  if (d.count == 0) return d;
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
    d.error = cudaGetErrorName(cudaGetLastError());
    d.count = 0;
    return d;
  }
  d.name = p.name;
  d.sm_count = p.multiProcessorCount;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
  cudaDeviceGetAttribute(&d.clock_khz, cudaDevAttrClockRate, 0);
  set_bf16_peak(d);
  cudaFuncAttributes fa;
  const cudaError_t ke = cudaFuncGetAttributes(&fa, probe_kernel);
  if (ke != cudaSuccess) {
    d.kernels_error = std::string(cudaGetErrorName(ke)) + ", " + cudaGetErrorString(ke);
    cudaGetLastError();  // clear it
  }
  return d;
}

}  // namespace jtok::cuda
