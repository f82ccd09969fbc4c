// The CUDA devices this process sees, and the check behind `--device cuda`. A plain C++ header:
// the CPU-only build has it too (device_require.cpp), where require_cuda_device() says the binary
// was built without CUDA.
#pragma once
#include <cstdint>
#include <string>

namespace jtok::cuda {

struct DeviceInfo {
  int count = 0;             // devices visible; 0 without a driver or a GPU
  std::string name;          // device 0's name, e.g. "NVIDIA H200"
  int sm_count = 0;          // streaming multiprocessors of device 0
  int cc_major = 0, cc_minor = 0;  // compute capability of device 0
  int64_t memory_bytes = 0;  // device 0's global memory
  int clock_khz = 0;         // device 0's peak SM clock
  double bf16_peak_tflops = 0;  // dense bf16 tensor-core peak of device 0, the MFU denominator
  std::string peak_how;      // where bf16_peak_tflops comes from (datasheet or SMs x clock x rate)
  int driver_version = 0;    // cudaDriverGetVersion: 0 = no driver installed (e.g. 13000 = 13.0)
  int runtime_version = 0;   // cudaRuntimeGetVersion: the CUDA runtime linked into jtok
  std::string error;         // why count is 0, when the runtime said (e.g. cudaErrorInsufficientDriver)
  // Empty when this build's kernels run on device 0; else why not, as the runtime said when asked
  // for one of them (cudaFuncGetAttributes: cudaErrorNoKernelImageForDevice on an architecture
  // the build has no code for).
  std::string kernels_error;
};

// Probes device 0 (never throws for a missing driver or GPU: count 0 and the versions seen).
// Only in a build with CUDA (src/cuda/device.cu).
DeviceInfo device_info();

// One line: "NVIDIA H200, 132 SMs, 139.8 GiB, sm_90, bf16 peak 989 TFLOP/s (...), driver 13.0, runtime
// 13.0, kernels for sm_90a" (or that they do not run on it).
std::string describe(const DeviceInfo& d);

// The CUDA architectures this jtok's kernels were compiled for, as CMAKE_CUDA_ARCHITECTURES says
// them ("90a", "80,90a"); "" in a build without CUDA.
std::string built_cuda_archs();

// `--device cuda`'s error for a device the kernels cannot run on (d.kernels_error set): names the
// device, its sm and the runtime's answer; where that says the build has no code for it, also the
// architectures built (archs) and how to build for it.
std::string kernels_cannot_run(const DeviceInfo& d, const std::string& archs);

// `--device cuda`'s gate: a device's info, or an Error "--device cuda: no CUDA device was found
// (driver version X, runtime version Y)" / "--device cuda: this jtok was built without CUDA ..." /
// kernels_cannot_run's.
DeviceInfo require_cuda_device();

// Whether this binary has the CUDA kernels (nvcc was found at configure time).
bool built_with_cuda();

// Device memory this process holds through DeviceArray and cuBLASLt's workspace (every cudaMalloc
// jtok makes): note_device_bytes(+n) after an allocation, (-n) after its free. The peak is what
// PyTorch's max_memory_allocated counts (not the CUDA context, not cuBLASLt's own), so a bench's
// peak memory compares with the peer's. 0 in a build without CUDA.
void note_device_bytes(int64_t delta);
int64_t device_bytes_now();
int64_t device_bytes_peak();
void reset_device_bytes_peak();  // the peak from now on starts at what is held now

}  // namespace jtok::cuda
