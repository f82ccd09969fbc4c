// The CUDA runtime's devices, memory and copies on the CPU (tests/cuda/emu/include/emu_runtime.h):
// device and pinned memory are host memory, told apart by their ranges (cudaPointerGetAttributes),
// with host registration's; copies run on their stream as emu_streams.cpp's work does (at once, into
// a capture, or queued with EMU_STREAMS=lazy), and what they write to memory that is not the
// device's is hashed (host_copy_digest: what the host saw of the device).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "emu_runtime.h"

namespace {

struct Registered {
  size_t bytes;
};
std::map<uintptr_t, Registered> g_registered;        // host ranges by first byte
std::map<uintptr_t, Registered> g_device, g_pinned;  // cudaMalloc's and cudaHostAlloc's allocations

// The range of `ranges` holding p, or end().
std::map<uintptr_t, Registered>::iterator range_at(std::map<uintptr_t, Registered>& ranges, const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = ranges.upper_bound(a);
  if (it == ranges.begin()) return ranges.end();
  --it;
  return a < it->first + it->second.bytes ? it : ranges.end();
}
std::map<uintptr_t, Registered>::iterator registered_at(const void* p) { return range_at(g_registered, p); }

cudaError_t allocate(void** p, size_t n, std::map<uintptr_t, Registered>& ranges) {
  if (const cudaError_t e = emu::blocking_call()) return e;
  if (posix_memalign(p, 256, n ? n : 1) != 0) return cudaErrorMemoryAllocation;
  // Never written yet: all ones (NaN as floats, -1 as ints), the same on every run. Neither cudaMalloc
  // nor cudaMallocHost clears memory; a kernel that reads what nothing wrote reads NaN here.
  std::memset(*p, 0xff, n ? n : 1);
  ranges[reinterpret_cast<uintptr_t>(*p)] = {n ? n : 1};
  return cudaSuccess;
}
cudaError_t release(void* p, std::map<uintptr_t, Registered>& ranges) {
  if (const cudaError_t e = emu::blocking_call()) return e;
  emu::drain_streams(false);  // cudaFree and cudaFreeHost wait for the device (a no-op unless lazy)
  if (!p) return cudaSuccess;
  if (ranges.erase(reinterpret_cast<uintptr_t>(p)) == 0) return cudaErrorInvalidValue;
  std::free(p);
  return cudaSuccess;
}

uint64_t g_copy_digest = 0;
// A copy of n bytes to d: hashed where d is not device memory (FNV-1a over 8-byte words).
void note_copy(const void* d, size_t n) {
  if (range_at(g_device, d) != g_device.end()) return;
  const auto* p = static_cast<const unsigned char*>(d);
  uint64_t h = g_copy_digest ^ n;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, std::min<size_t>(8, n - i));
    h = (h ^ w) * 0x100000001b3ull;
  }
  g_copy_digest = h;
  static const bool trace = std::getenv("EMU_DIGEST_TRACE") != nullptr;
  if (trace)
    std::fprintf(stderr, "cuda emulation: %zu bytes to the host, digest %016llx\n", n,
                 static_cast<unsigned long long>(h));
}

// Pageable memory: neither the device's, nor pinned, nor registered.
bool pageable(const void* p) {
  return range_at(g_device, p) == g_device.end() && range_at(g_pinned, p) == g_pinned.end() &&
         registered_at(p) == g_registered.end();
}

// An asynchronous copy queued lazily behaves as the GPU's with pageable memory:
// from pageable memory the bytes are taken at the call (staged: the caller may reuse them at once),
// and into pageable memory the call returns once the copy is done (wait).
struct LazyCopy {
  std::shared_ptr<std::vector<char>> source;
  bool wait = false;
};
LazyCopy lazy_copy(cudaStream_t st, void* d, const void* s, size_t n) {
  LazyCopy lc;
  if (!emu::lazy_streams() || emu::capturing(st)) return lc;
  if (n && pageable(s))
    lc.source = std::make_shared<std::vector<char>>(static_cast<const char*>(s), static_cast<const char*>(s) + n);
  lc.wait = pageable(d);
  return lc;
}

// A capture refuses a copy to or from pageable memory (a graph's copies are the DMA engine's), and
// is invalidated by it; otherwise cudaSuccess.
cudaError_t capture_refuses(cudaStream_t st, const void* d, const void* s, size_t n) {
  return emu::capturing(st) && n && (pageable(s) || pageable(d)) ? emu::blocking_call(st) : cudaSuccess;
}

}  // namespace

namespace emu {

uint64_t host_copy_digest() { return g_copy_digest; }
void reset_host_copy_digest() { g_copy_digest = 0; }

}  // namespace emu

cudaError_t cudaMalloc(void** p, size_t n) { return allocate(p, n, g_device); }
cudaError_t cudaFree(void* p) { return release(p, g_device); }
cudaError_t cudaMallocHost(void** p, size_t n) { return allocate(p, n, g_pinned); }
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned) { return allocate(p, n, g_pinned); }
cudaError_t cudaFreeHost(void* p) { return release(p, g_pinned); }
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  *a = {};
  void* q = const_cast<void*>(p);
  if (range_at(g_device, p) != g_device.end()) {
    a->type = cudaMemoryTypeDevice;
    a->devicePointer = q;
  } else if (range_at(g_pinned, p) != g_pinned.end() || registered_at(p) != g_registered.end()) {
    a->type = cudaMemoryTypeHost;
    a->devicePointer = a->hostPointer = q;
  } else {
    a->hostPointer = q;
  }
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* p, size_t n, unsigned) {
  if (const cudaError_t e = emu::blocking_call()) return e;
  if (!p || n == 0) return cudaErrorInvalidValue;
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto next = g_registered.lower_bound(a);
  if (registered_at(p) != g_registered.end() || (next != g_registered.end() && next->first < a + n))
    return cudaErrorHostMemoryAlreadyRegistered;
  g_registered[a] = {n};
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* p) {
  if (const cudaError_t e = emu::blocking_call()) return e;
  emu::drain_streams(false);
  auto it = g_registered.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_registered.end()) return cudaErrorHostMemoryNotRegistered;
  g_registered.erase(it);
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** d, void* host, unsigned flags) {
  if (flags != 0 || registered_at(host) == g_registered.end()) return cudaErrorInvalidValue;
  *d = host;  // mapped memory: the device reads the host's bytes
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  if (const cudaError_t e = emu::blocking_call()) return e;
  emu::note_host_wait();
  emu::drain_streams(true);  // the legacy stream's barrier (a no-op unless lazy)
  if (n) std::memmove(d, s, n);
  note_copy(d, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t st) {
  if (const cudaError_t r = capture_refuses(st, d, s, n)) return r;
  const LazyCopy lc = lazy_copy(st, d, s, n);
  const cudaError_t e = emu::submit(st, [=] {
    if (n) std::memmove(d, lc.source ? lc.source->data() : s, n);
    note_copy(d, n);
  });
  if (e == cudaSuccess && lc.wait) emu::run_stream(st);
  return e;
}
cudaError_t cudaMemcpy2DAsync(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h, cudaMemcpyKind,
                              cudaStream_t st) {
  const size_t span = h ? (h - 1) * sp + w : 0;
  if (const cudaError_t r = capture_refuses(st, d, s, span)) return r;
  const LazyCopy lc = lazy_copy(st, d, s, span);
  const cudaError_t e = emu::submit(st, [=] {
    const char* from = lc.source ? lc.source->data() : static_cast<const char*>(s);
    for (size_t r = 0; r < h; ++r) {
      std::memmove(static_cast<char*>(d) + r * dp, from + r * sp, w);
      note_copy(static_cast<char*>(d) + r * dp, w);
    }
  });
  if (e == cudaSuccess && lc.wait) emu::run_stream(st);
  return e;
}
cudaError_t cudaMemset(void* p, int v, size_t n) {
  if (const cudaError_t e = emu::blocking_call()) return e;
  emu::drain_streams(true);
  if (n) std::memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t st) {
  return emu::submit(st, [=] {
    if (n) std::memset(p, v, n);
  });
}

cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (d != 0) return cudaErrorInvalidValue;
  *p = {};
  std::snprintf(p->name, sizeof p->name, "emulated sm_90 on the CPU");
  p->totalGlobalMem = size_t{80} << 30;
  p->multiProcessorCount = 132;
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
  if (d != 0) return cudaErrorInvalidValue;
  *v = a == cudaDevAttrClockRate ? 1980000 : 1;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = *total_bytes = size_t{80} << 30;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
