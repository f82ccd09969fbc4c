// `--device cuda`'s gate, compiled in every build: with CUDA it probes the devices
// (device.cu), without it says so and why. CMakeLists.txt sets JTOK_HAVE_CUDA for this file, or
// JTOK_NO_CUDA_REASON (1: JTOK_CUDA=OFF, 2: a sanitizer / fuzz build, 3: no nvcc found).
#include <atomic>
#include <cstdio>

#include "core/error.h"
#include "cuda/decoder.h"
#include "cuda/device.h"
#include "cuda/device_peak.h"
#include "cuda/kernel_trace.h"
#include "cuda/training.h"

namespace jtok::cuda {

namespace {
// 13000 -> "13.0"; 0 -> "0 (no driver)".
std::string version_text(int v) {
  if (v == 0) return "0";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%d.%d", v / 1000, (v % 1000) / 10);
  return buf;
}
std::atomic<int64_t> g_device_bytes{0}, g_device_bytes_peak{0};
}  // namespace

void note_device_bytes(int64_t delta) {
  const int64_t now = g_device_bytes.fetch_add(delta) + delta;
  int64_t peak = g_device_bytes_peak.load();
  while (now > peak && !g_device_bytes_peak.compare_exchange_weak(peak, now)) {
  }
}
int64_t device_bytes_now() { return g_device_bytes.load(); }
int64_t device_bytes_peak() { return g_device_bytes_peak.load(); }
void reset_device_bytes_peak() { g_device_bytes_peak.store(g_device_bytes.load()); }

#ifndef JTOK_CUDA_ARCHS
#define JTOK_CUDA_ARCHS ""  // a build without CUDA, or one that did not say (the emulation)
#endif
std::string built_cuda_archs() { return JTOK_CUDA_ARCHS; }

// "90a" / "80,90a" -> "sm_90a" / "sm_80, sm_90a"; "" -> "an unrecorded architecture".
static std::string sm_list(const std::string& archs) {
  if (archs.empty()) return "an unrecorded architecture";
  std::string out = "sm_";
  for (char c : archs) out += c == ',' ? std::string(", sm_") : std::string(1, c);
  return out;
}

std::string kernels_cannot_run(const DeviceInfo& d, const std::string& archs) {
  const std::string sm = std::to_string(d.cc_major) + std::to_string(d.cc_minor);
  const std::string& e = d.kernels_error;
  const bool no_code = e.starts_with("cudaErrorNoKernelImageForDevice") ||
                       e.starts_with("cudaErrorInvalidDeviceFunction") ||
                       e.starts_with("cudaErrorUnsupportedPtxVersion");
  if (!no_code)  // busy, prohibited, out of memory: not the build's architectures
    return "--device cuda: device 0, " + d.name + " (sm_" + sm + "), cannot run this jtok's kernels: " + e;
  return "--device cuda: this jtok's kernels are built for " + sm_list(archs) + " and cannot run on device 0, " +
         d.name + " (sm_" + sm + "): " + e + "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + sm +
         " (docs/cuda.md, Build)";
}

std::string describe(const DeviceInfo& d) {
  char buf[768];
  if (d.count == 0) {
    std::snprintf(buf, sizeof buf, "no CUDA device (driver version %s, runtime version %s%s%s)",
                  version_text(d.driver_version).c_str(), version_text(d.runtime_version).c_str(),
                  d.error.empty() ? "" : "; ", d.error.c_str());
    return buf;
  }
  const std::string kernels = "kernels for " + sm_list(built_cuda_archs()) +
                              (d.kernels_error.empty() ? "" : " (they do not run on it: " + d.kernels_error + ")");
  std::snprintf(buf, sizeof buf,
                "%s, %d SMs, %.1f GiB, sm_%d%d, bf16 peak %.0f TFLOP/s (%s), driver %s, runtime %s, %s", d.name.c_str(),
                d.sm_count, static_cast<double>(d.memory_bytes) / (1024.0 * 1024.0 * 1024.0), d.cc_major, d.cc_minor,
                d.bf16_peak_tflops, d.peak_how.c_str(), version_text(d.driver_version).c_str(),
                version_text(d.runtime_version).c_str(), kernels.c_str());
  return buf;
}

#ifdef JTOK_HAVE_CUDA
bool built_with_cuda() { return true; }

DeviceInfo require_cuda_device() {
  DeviceInfo d = device_info();
  if (d.count == 0)
    fail("--device cuda: no CUDA device was found (driver version ", d.driver_version, ", runtime version ",
         d.runtime_version, d.driver_version == 0 ? "; 0 = no driver installed" : "",
         d.error.empty() ? "" : "; ", d.error, ")");
  if (!d.kernels_error.empty()) fail(kernels_cannot_run(d, built_cuda_archs()));
  return d;
}
#else
bool built_with_cuda() { return false; }

DeviceInfo require_cuda_device() {
#if JTOK_NO_CUDA_REASON == 1
  const char* why = "configured with -DJTOK_CUDA=OFF";
#elif JTOK_NO_CUDA_REASON == 2
  const char* why = "the sanitizer and fuzz builds leave the CUDA kernels out";
#else
  const char* why = "no nvcc was found at configure time; install the CUDA toolkit and reconfigure";
#endif
  fail("--device cuda: this jtok was built without CUDA (", why, "; docs/cuda.md)");
}

std::unique_ptr<DeviceTrainer> make_device_trainer(const Model&, const HostAdamWView&, bool,
                                                   const DeviceTableOptions&) {
  require_cuda_device();  // says why there is none
  return nullptr;
}

std::unique_ptr<DeviceDecoder> make_device_decoder(const Model&, const DecoderSettings&) {
  require_cuda_device();  // says why there is none
  return nullptr;
}

DevicePeaks measure_device_peaks(const std::vector<std::array<int64_t, 3> >&, int64_t, int) {
  require_cuda_device();  // says why there is none
  return {};
}
double sampled_product_error(const void*, int64_t, int64_t, int64_t) {
  require_cuda_device();
  return 0;
}

std::string kernel_trace_start() {
  try {
    require_cuda_device();
  } catch (const Error& e) {
    return e.what();
  }
  return "unreachable";
}
std::vector<TraceRecord> kernel_trace_stop(uint64_t*) { return {}; }
void parse_activity_records(uint8_t*, size_t, std::vector<TraceRecord>&) { require_cuda_device(); }
std::vector<uint8_t> activity_records_for_test(const std::vector<TraceRecord>&) {
  require_cuda_device();
  return {};
}
#endif

}  // namespace jtok::cuda
