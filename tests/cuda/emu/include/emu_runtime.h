// The CUDA runtime on the CPU (tests/cuda/emu): device memory is host memory, every copy, memset,
// launch and host function runs when called (a stream orders nothing that is not already in
// order), events and streams are tokens. What a launch checks (emu_sched.cpp) is what the GPU
// rejects: an empty grid, a block of 0 or > 1024 threads, dynamic shared memory past 48 KiB
// without cudaFuncSetAttribute, or past the 227 KiB an sm_90 block may have: the launch does not
// run and cudaGetLastError returns the error, as on the device.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>

#include "emu_device.h"

struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,
};
using cudaError = cudaError_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
using cudaHostFn_t = void (*)(void*);
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostRegisterDefault 0x00
#define cudaHostAllocDefault 0x00

namespace emu {
cudaError_t take_last_error();
void set_last_error(cudaError_t e);
const char* error_name(cudaError_t e);
// Records a kernel's cudaFuncAttributeMaxDynamicSharedMemorySize.
void set_max_dynamic_shared(const void* fn, int bytes);

struct Config {
  dim3 grid, block;
  size_t shared = 0;
};
// Runs body(thread) for every thread of every block, blocks in order (emu_sched.cpp).
void run_grid(const char* kernel, const void* fn, const Config& c, const std::function<void()>& body);

template <typename G, typename B>
Config config(G grid, B block, size_t shared = 0, cudaStream_t = nullptr) {
  return {dim3(grid), dim3(block), shared};
}
inline Config config(dim3 grid, dim3 block, size_t shared = 0, cudaStream_t = nullptr) { return {grid, block, shared}; }

// kernel<<<grid, block, shared, stream>>>(args...) as cu2cpp.py writes it: the arguments converted
// to the kernel's parameter types once, as a launch copies them, then the kernel per thread.
template <typename... P, typename... A>
void launch(const Config& c, const char* name, void (*kernel)(P...), A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
  const std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
  run_grid(name, reinterpret_cast<const void*>(kernel), c, [&] { std::apply(kernel, params); });
}
// A kernel template launched without template arguments (they deduced from the arguments, as nvcc
// does): cu2cpp.py passes [](auto... p) { kernel(p...); }. The arguments are copied once, decayed;
// each thread's call converts them to the parameter types. No function pointer: the default
// dynamic shared memory limit (cudaFuncSetAttribute names an instantiation, so it is never needed here).
template <typename K, typename... A>
void launch_deduced(const Config& c, const char* name, K kernel, A&&... args) {
  const std::tuple<std::decay_t<A>...> params(std::forward<A>(args)...);
  run_grid(name, nullptr, c, [&] { std::apply(kernel, params); });
}
}  // namespace emu

inline cudaError_t cudaGetLastError() { return emu::take_last_error(); }
inline const char* cudaGetErrorName(cudaError_t e) { return emu::error_name(e); }
inline const char* cudaGetErrorString(cudaError_t e) { return emu::error_name(e); }
// cudaMalloc's 256-byte alignment, and exactly n bytes: under EMU_SANITIZE=1 a read one past the
// end is reported (the GPU's allocation granularity would hide it).
inline cudaError_t cudaMalloc(void** p, size_t n) {
  return posix_memalign(p, 256, n ? n : 1) == 0 ? cudaSuccess : cudaErrorMemoryAllocation;
}
template <typename T>
cudaError_t cudaMalloc(T** p, size_t n) { return cudaMalloc(reinterpret_cast<void**>(p), n); }
inline cudaError_t cudaFree(void* p) { std::free(p); return cudaSuccess; }
inline cudaError_t cudaMallocHost(void** p, size_t n) { return cudaMalloc(p, n); }
inline cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
inline cudaError_t cudaHostRegister(void*, size_t, unsigned) { return cudaSuccess; }
inline cudaError_t cudaHostUnregister(void*) { return cudaSuccess; }
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  if (n) std::memmove(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t = nullptr) {
  return cudaMemcpy(d, s, n, k);
}
inline cudaError_t cudaMemcpy2DAsync(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h, cudaMemcpyKind,
                                     cudaStream_t = nullptr) {
  for (size_t r = 0; r < h; ++r) std::memmove(static_cast<char*>(d) + r * dp, static_cast<const char*>(s) + r * sp, w);
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int v, size_t n) { if (n) std::memset(p, v, n); return cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t = nullptr) { return cudaMemset(p, v, n); }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { *s = reinterpret_cast<cudaStream_t>(new char); return cudaSuccess; }
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
inline cudaError_t cudaStreamDestroy(cudaStream_t s) { delete reinterpret_cast<char*>(s); return cudaSuccess; }
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned = 0) { return cudaSuccess; }
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = reinterpret_cast<cudaEvent_t>(new char); return cudaSuccess; }
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete reinterpret_cast<char*>(e); return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = nullptr) { return cudaSuccess; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t fn, void* data) { fn(data); return cudaSuccess; }
template <typename F>
cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute a, int v) {
  if (a == cudaFuncAttributeMaxDynamicSharedMemorySize) emu::set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), v);
  return cudaSuccess;
}
