// The CUDA runtime on the CPU (tests/cuda/emu): device memory is host memory, every copy, memset,
// launch and host function runs when called (a stream orders nothing that is not already in order;
// EMU_STREAMS=lazy: when something waits for it), unless its stream is capturing a graph
// (emu_streams.cpp): then it is recorded, with its arguments as they are now, and runs at each
// cudaGraphLaunch, as on the device; what a capture forbids (a blocking call, the legacy stream, a
// side stream not joined back) fails it as there.
// What a launch checks (emu_sched.cpp) is what the GPU rejects: an empty grid, a block of 0 or
// > 1024 threads, a block past the kernel's __launch_bounds__ (ptxas fits the registers to that
// bound, so more threads need more registers than an SM has: cudaErrorLaunchOutOfResources),
// dynamic shared memory past 48 KiB without cudaFuncSetAttribute, or past the 227 KiB an sm_90
// block may have: the launch does not run and cudaGetLastError returns the error.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>

#include "emu_device.h"

struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;
struct CUgraphNode_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraphExec_st*;
using cudaGraphNode_t = CUgraphNode_st*;
enum cudaGraphNodeType { cudaGraphNodeTypeKernel = 0x00, cudaGraphNodeTypeMemcpy = 0x01 };  // the rest: memcpy here
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorLaunchOutOfResources = 7,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorECCUncorrectable = 214,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchTimeout = 702,
  cudaErrorAssert = 710,
  cudaErrorHostMemoryAlreadyRegistered = 712,
  cudaErrorHostMemoryNotRegistered = 713,
  cudaErrorHardwareStackError = 714,
  cudaErrorIllegalInstruction = 715,
  cudaErrorMisalignedAddress = 716,
  cudaErrorInvalidAddressSpace = 717,
  cudaErrorInvalidPc = 718,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureImplicit = 906,
};
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1,
                             cudaStreamCaptureModeRelaxed = 2 };
enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2 };
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};
enum cudaDeviceAttr { cudaDevAttrClockRate = 13, cudaDevAttrHostRegisterReadOnlySupported = 113 };
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int multiProcessorCount, major, minor;
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
struct cudaFuncAttributes {  // the fields jtok reads: none (device_info asks whether the kernel exists)
  int maxThreadsPerBlock;
};
using cudaHostFn_t = void (*)(void*);
// A graph's edges (cuda/pdl_edges.cu): the emulated graph runs its nodes in capture order and keeps
// no edges, so reading them answers cudaErrorNotSupported (the decoder then keeps its plain graph).
enum cudaGraphDependencyType { cudaGraphDependencyTypeDefault = 0, cudaGraphDependencyTypeProgrammatic = 1 };
struct cudaGraphEdgeData {
  unsigned char from_port, to_port, type, reserved[5];
};
#define cudaGraphKernelNodePortDefault 0
#define cudaGraphKernelNodePortProgrammatic 1
#define cudaGraphKernelNodePortLaunchCompletion 2
struct cudaKernelNodeParams {
  void* func;
};
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostRegisterDefault 0x00
#define cudaHostRegisterPortable 0x01
#define cudaHostRegisterMapped 0x02
#define cudaHostRegisterReadOnly 0x08
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
  cudaStream_t stream = nullptr;
  unsigned max_threads = 1024;  // the kernel's __launch_bounds__ (cu2cpp.py passes it: bounded)
  Config& bounded(unsigned launch_bounds) {
    max_threads = launch_bounds;
    return *this;
  }
};
// Runs body(thread) for every thread of every block, blocks in order, or last first with
// EMU_ORDER=reverse (emu_sched.cpp).
void run_grid(const char* kernel, const void* fn, const Config& c, const std::function<void()>& body);
// Sets the order run_grid runs threads and blocks in (reverse: last first); returns the one before.
bool set_reverse_order(bool reverse);
// What run_grid would refuse (emu_sched.cpp): checked when a launch is made, captured or not.
cudaError_t check_launch(const void* fn, const Config& c);

// Work on stream s (emu_streams.cpp): run now, or recorded into the graph s is capturing (kernel: a
// launch, counted as such). An error when the capture refuses it (the legacy stream during a
// capture, a capture already invalidated). EMU_GRAPH_NODES=1 prints each instantiated graph's nodes
// and kernels on stderr.
cudaError_t submit(cudaStream_t s, std::function<void()> work, bool kernel = false);
// EMU_STREAMS=lazy's switch (emu_streams.cpp): on, work on a stream runs only when something waits
// for it; the queued work runs first. Returns the setting before.
bool set_lazy_streams(bool lazy);
// For the memory calls (emu_memory.cpp): whether streams are lazy; every stream's queued work run
// (blocking_only: the legacy stream's and the blocking streams', as a synchronous copy waits for);
// stream s's (null: the legacy stream's); whether s is capturing a graph. Without EMU_STREAMS=lazy
// nothing is queued, so the runs are no-ops.
bool lazy_streams();
void drain_streams(bool blocking_only);
void run_stream(cudaStream_t s);
bool capturing(cudaStream_t s);
// A blocking or synchronising call (cudaMalloc, cudaMemcpy, cudaStreamSynchronize, ...) made while
// this process captures a graph in global or thread-local mode: cudaErrorStreamCaptureUnsupported,
// the capture invalidated (s: the stream it names, if any). cudaSuccess when no capture forbids it.
cudaError_t blocking_call(cudaStream_t s = nullptr);
// The host's waits for the device since the process began (cudaStreamSynchronize, cudaEventSynchronize,
// cudaDeviceSynchronize, cudaMemcpy): a case counts a call's round trips by the difference.
uint64_t host_waits();
void note_host_wait();
// A hash of every byte the copies (cudaMemcpy*) have written to memory that is not the device's,
// in order, since the last reset (emu_streams.cpp): what the host saw of the device, for comparing
// two emulated runs of the same case (emu_digest_test.cpp).
uint64_t host_copy_digest();
void reset_host_copy_digest();
// The work run since the caller last zeroed it: kernels (run_grid's grids, a graph's at each
// replay) and cuBLASLt products (fake_cublaslt.cpp); EMU_LAUNCHES=file writes each case's
// (emu_digest_test.cpp), the launches a change adds or saves.
struct WorkCounts {
  uint64_t kernels = 0, products = 0;
};
WorkCounts& work_counts();
// Where set, run_grid reports each grid it runs: the kernel's name, the stream it was launched on,
// and the host's steady clock around the run (fake_kernel_trace.cpp: the emulated kernel trace).
using GridHook = void (*)(const char* kernel, cudaStream_t s, uint64_t start_ns, uint64_t end_ns);
GridHook& grid_hook();

template <typename G, typename B>
Config config(G grid, B block, size_t shared = 0, cudaStream_t s = nullptr) {
  return {dim3(grid), dim3(block), shared, s};
}
inline Config config(dim3 grid, dim3 block, size_t shared = 0, cudaStream_t s = nullptr) {
  return {grid, block, shared, s};
}

template <typename Params, typename K>
void launch_params(const Config& c, const char* name, const void* fn, K kernel, std::shared_ptr<const Params> p) {
  cudaError_t e = check_launch(fn, c);
  if (e == cudaSuccess)
    e = submit(
        c.stream, [c, name, fn, kernel, p] { run_grid(name, fn, c, [&] { std::apply(kernel, *p); }); }, true);
  if (e != cudaSuccess) set_last_error(e);
}

// kernel<<<grid, block, shared, stream>>>(args...) as cu2cpp.py writes it: the arguments converted
// to the kernel's parameter types once, as a launch copies them, then the kernel per thread.
template <typename... P, typename... A>
void launch(const Config& c, const char* name, void (*kernel)(P...), A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
  using Params = std::tuple<std::decay_t<P>...>;
  launch_params<Params>(c, name, reinterpret_cast<const void*>(kernel), kernel,
                        std::make_shared<const Params>(std::forward<A>(args)...));
}
// A kernel template launched without template arguments (they deduced from the arguments, as nvcc
// does): cu2cpp.py passes [](auto... p) { kernel(p...); }. The arguments are copied once, decayed;
// each thread's call converts them to the parameter types. No function pointer: the default
// dynamic shared memory limit (cudaFuncSetAttribute names an instantiation, so it is never needed here).
template <typename K, typename... A>
void launch_deduced(const Config& c, const char* name, K kernel, A&&... args) {
  using Params = std::tuple<std::decay_t<A>...>;
  launch_params<Params>(c, name, nullptr, kernel, std::make_shared<const Params>(std::forward<A>(args)...));
}
}  // namespace emu

inline cudaError_t cudaGetLastError() { return emu::take_last_error(); }
inline const char* cudaGetErrorName(cudaError_t e) { return emu::error_name(e); }
inline const char* cudaGetErrorString(cudaError_t e) { return emu::error_name(e); }
// cudaMalloc's 256-byte alignment, and exactly n bytes: under EMU_SANITIZE=1 a read one past the
// end is reported (the GPU's allocation granularity would hide it).
cudaError_t cudaMalloc(void** p, size_t n);
template <typename T>
cudaError_t cudaMalloc(T** p, size_t n) { return cudaMalloc(reinterpret_cast<void**>(p), n); }
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t n);
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned flags);
cudaError_t cudaFreeHost(void* p);
// Registered ranges are kept: a range registered twice, an unregistration or a device pointer of
// memory never registered fail as on the device.
cudaError_t cudaHostRegister(void* p, size_t n, unsigned flags);
cudaError_t cudaHostUnregister(void* p);
cudaError_t cudaHostGetDevicePointer(void** d, void* host, unsigned flags);
// Device for cudaMalloc's memory, host for cudaHostAlloc's and registered ranges, else unregistered.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p);
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t st = nullptr);
cudaError_t cudaMemcpy2DAsync(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h, cudaMemcpyKind k,
                              cudaStream_t st = nullptr);
cudaError_t cudaMemset(void* p, int v, size_t n);
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t st = nullptr);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int priority);
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
// The host time between the two records' runs, in ms; events made with cudaEventDisableTiming or
// never recorded fail as on the device.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t* nodes, size_t* n);
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, cudaGraphNodeType* type);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphGetEdges(cudaGraph_t g, cudaGraphNode_t* from, cudaGraphNode_t* to, cudaGraphEdgeData* data,
                              size_t* n);
cudaError_t cudaGraphRemoveDependencies(cudaGraph_t g, const cudaGraphNode_t* from, const cudaGraphNode_t* to,
                                        const cudaGraphEdgeData* data, size_t n);
cudaError_t cudaGraphAddDependencies(cudaGraph_t g, const cudaGraphNode_t* from, const cudaGraphNode_t* to,
                                     const cudaGraphEdgeData* data, size_t n);
cudaError_t cudaGraphKernelNodeGetParams(cudaGraphNode_t node, cudaKernelNodeParams* p);
cudaError_t cudaFuncGetName(const char** name, const void* func);
// One emulated device: an sm_90 with an H100's 132 SMs and 80 GiB (what decoder_setup sizes by).
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d);
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaDriverGetVersion(int* v);
cudaError_t cudaRuntimeGetVersion(int* v);
// Every kernel has code on the emulated device.
template <typename F>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, F* kernel) {
  a->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}
template <typename F>
cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute a, int v) {
  if (a == cudaFuncAttributeMaxDynamicSharedMemorySize) emu::set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), v);
  return cudaSuccess;
}
