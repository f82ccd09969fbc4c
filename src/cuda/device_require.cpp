// `--device cuda`'s gate, compiled in every build: with CUDA it probes the devices
// (device.cu), without it says so and why. CMakeLists.txt sets JTOK_HAVE_CUDA for this file, or
// JTOK_NO_CUDA_REASON (1: JTOK_CUDA=OFF, 2: a sanitizer / fuzz build, 3: no nvcc found).
#include <atomic>
#include <cstdio>

#include "core/error.h"
#include "cuda/decoder.h"
#include "cuda/device.h"
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

std::string describe(const DeviceInfo& d) {
  char buf[512];
  if (d.count == 0) {
    std::snprintf(buf, sizeof buf, "no CUDA device (driver version %s, runtime version %s%s%s)",
                  version_text(d.driver_version).c_str(), version_text(d.runtime_version).c_str(),
                  d.error.empty() ? "" : "; ", d.error.c_str());
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%s, %d SMs, %.1f GiB, sm_%d%d, bf16 peak %.0f TFLOP/s (%s), driver %s, runtime %s",
                d.name.c_str(), d.sm_count, static_cast<double>(d.memory_bytes) / (1024.0 * 1024.0 * 1024.0),
                d.cc_major, d.cc_minor, d.bf16_peak_tflops, d.peak_how.c_str(),
                version_text(d.driver_version).c_str(), version_text(d.runtime_version).c_str());
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

std::unique_ptr<DeviceTrainer> make_device_trainer(const Model&, const HostAdamWView&, bool, bool, bool, bool) {
  require_cuda_device();  // says why there is none
  return nullptr;
}

std::unique_ptr<DeviceDecoder> make_device_decoder(const Model&, const DecoderSettings&) {
  require_cuda_device();  // says why there is none
  return nullptr;
}
#endif

}  // namespace jtok::cuda
