// The CUDA runtime's memory, streams, events and graphs on the CPU (tests/cuda/emu/include/emu_runtime.h).
// Work runs when submitted, except on a stream that is capturing: then it is recorded, as a graph
// node is, with the launch arguments of that moment, and runs at every cudaGraphLaunch. A capture
// follows the device's rules that the decoder's graphs depend on:
//   - a stream joins a capture by waiting on an event recorded in it (a fork), and must be joined
//     back (the origin, or a stream of the capture, waits on an event recorded after its last
//     work) before cudaStreamEndCapture: else cudaErrorStreamCaptureUnjoined;
//   - the legacy stream (null) during a capture: cudaErrorStreamCaptureImplicit;
//   - a blocking call (cudaMalloc, cudaFree, cudaMemcpy, cudaMemset, a synchronize) during a
//     global or thread-local capture: cudaErrorStreamCaptureUnsupported;
// each of which invalidates the capture: cudaStreamEndCapture then gives no graph and
// cudaErrorStreamCaptureInvalidated. The emulation is single-threaded: "this thread" is the process.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "emu_runtime.h"

using Work = std::function<void()>;
using Clock = std::chrono::steady_clock;

struct CUgraphNode_st {
  bool kernel = false;
};
struct CUgraph_st {
  std::vector<Work> nodes;
  std::vector<std::unique_ptr<CUgraphNode_st>> handles;  // one a node: its type
  size_t kernels = 0;
};
struct CUgraphExec_st {
  std::vector<Work> nodes;
};

namespace {

struct Capture {
  cudaStream_t origin = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
  bool invalid = false;
  std::unique_ptr<CUgraph_st> graph = std::make_unique<CUgraph_st>();
  std::map<cudaStream_t, long> work;    // stream of the capture -> work it has recorded
  std::map<cudaStream_t, long> joined;  // -> its work that the others have waited for
};

}  // namespace

struct CUstream_st {
  unsigned flags = 0;
  std::shared_ptr<Capture> capture;  // the capture it is part of, if any
};
struct CUevent_st {
  unsigned flags = 0;
  bool recorded = false;
  Clock::time_point at{};
  std::shared_ptr<Capture> capture;  // recorded during this capture: a node of it
  cudaStream_t stream = nullptr;     // where it was recorded, with the work that stream had by then
  long work = 0;
};

namespace {

std::set<std::shared_ptr<Capture>> g_captures;  // active captures

struct Registered {
  size_t bytes;
};
std::map<uintptr_t, Registered> g_registered;  // host ranges by first byte
std::map<uintptr_t, Registered> g_device, g_pinned;  // cudaMalloc's and cudaHostAlloc's allocations

void invalidate_all() {
  for (const auto& c : g_captures) c->invalid = true;
}

bool forbids_blocking() {
  for (const auto& c : g_captures)
    if (c->mode != cudaStreamCaptureModeRelaxed) return true;
  return false;
}

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
  if (trace) std::fprintf(stderr, "cuda emulation: %zu bytes to the host, digest %016llx\n", n,
                          static_cast<unsigned long long>(h));
}

}  // namespace

namespace emu {

uint64_t host_copy_digest() { return g_copy_digest; }
void reset_host_copy_digest() { g_copy_digest = 0; }

cudaError_t submit(cudaStream_t s, Work work, bool kernel) {
  if (s && s->capture) {
    Capture& c = *s->capture;
    if (c.invalid) return cudaErrorStreamCaptureInvalidated;
    c.graph->nodes.push_back(std::move(work));
    c.graph->handles.push_back(std::make_unique<CUgraphNode_st>(CUgraphNode_st{kernel}));
    c.graph->kernels += kernel;
    ++c.work[s];
    return cudaSuccess;
  }
  if (!s && !g_captures.empty()) {
    invalidate_all();
    return cudaErrorStreamCaptureImplicit;
  }
  work();
  return cudaSuccess;
}

cudaError_t blocking_call(cudaStream_t s) {
  if ((s && s->capture) || forbids_blocking()) {
    invalidate_all();
    return cudaErrorStreamCaptureUnsupported;
  }
  return cudaSuccess;
}

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
  if (n) std::memmove(d, s, n);
  note_copy(d, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t st) {
  return emu::submit(st, [=] {
    if (n) std::memmove(d, s, n);
    note_copy(d, n);
  });
}
cudaError_t cudaMemcpy2DAsync(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h, cudaMemcpyKind,
                              cudaStream_t st) {
  return emu::submit(st, [=] {
    for (size_t r = 0; r < h; ++r) {
      std::memmove(static_cast<char*>(d) + r * dp, static_cast<const char*>(s) + r * sp, w);
      note_copy(static_cast<char*>(d) + r * dp, w);
    }
  });
}
cudaError_t cudaMemset(void* p, int v, size_t n) {
  if (const cudaError_t e = emu::blocking_call()) return e;
  if (n) std::memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t st) {
  return emu::submit(st, [=] {
    if (n) std::memset(p, v, n);
  });
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  return emu::submit(s, [=] { fn(data); });
}

cudaError_t cudaDeviceSynchronize() { return emu::blocking_call(); }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return emu::blocking_call(s); }
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  *s = new CUstream_st{flags, nullptr};
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (s->capture) {
    s->capture->invalid = true;
    s->capture->work.erase(s);
  }
  delete s;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  *e = new CUevent_st;
  (*e)->flags = flags;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return cudaErrorInvalidResourceHandle;
  const cudaError_t r = emu::submit(s, [e] {
    e->recorded = true;
    e->at = Clock::now();
  });
  if (r != cudaSuccess) return r;
  e->capture = s ? s->capture : nullptr;
  e->stream = s;
  e->work = e->capture ? e->capture->work[s] : 0;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (!e) return cudaErrorInvalidResourceHandle;
  if (!e->capture) {  // an event of finished work
    if (s && s->capture && s->capture->invalid) return cudaErrorStreamCaptureInvalidated;
    return cudaSuccess;
  }
  Capture& c = *e->capture;
  if (!s) {
    invalidate_all();
    return cudaErrorStreamCaptureImplicit;
  }
  if (s->capture && s->capture != e->capture) return cudaErrorStreamCaptureUnmatched;  // two captures merged
  if (!s->capture) {  // a fork: s joins the capture
    s->capture = e->capture;
    c.work.emplace(s, 0);
    c.joined.emplace(s, 0);
  }
  if (e->stream != s) c.joined[e->stream] = std::max(c.joined[e->stream], e->work);
  return c.invalid ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  return emu::blocking_call(e->capture ? e->stream : nullptr);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!a || !b || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming))
    return cudaErrorInvalidResourceHandle;
  if (!a->recorded || !b->recorded) return cudaErrorInvalidResourceHandle;
  *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  if (!s) return cudaErrorStreamCaptureUnsupported;  // the legacy stream cannot capture
  if (s->capture) return cudaErrorIllegalState;
  auto c = std::make_shared<Capture>();
  c->origin = s;
  c->mode = mode;
  c->work[s] = 0;
  s->capture = c;
  g_captures.insert(c);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
  *g = nullptr;
  if (!s || !s->capture) return cudaErrorIllegalState;
  std::shared_ptr<Capture> c = s->capture;
  if (c->origin != s) {
    c->invalid = true;
    return cudaErrorStreamCaptureUnmatched;
  }
  g_captures.erase(c);
  bool unjoined = false;
  for (const auto& [stream, work] : c->work) {
    if (stream != s && c->joined[stream] < work) unjoined = true;
    stream->capture = nullptr;
  }
  if (c->invalid) return cudaErrorStreamCaptureInvalidated;
  if (unjoined) return cudaErrorStreamCaptureUnjoined;
  *g = c->graph.release();
  return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t* nodes, size_t* n) {
  if (!g || !n) return cudaErrorInvalidValue;
  if (nodes)
    for (size_t i = 0; i < std::min(*n, g->handles.size()); ++i) nodes[i] = g->handles[i].get();
  *n = nodes ? std::min(*n, g->handles.size()) : g->handles.size();
  return cudaSuccess;
}
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, cudaGraphNodeType* type) {
  if (!node || !type) return cudaErrorInvalidValue;
  *type = node->kernel ? cudaGraphNodeTypeKernel : cudaGraphNodeTypeMemcpy;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long) {
  if (!g) return cudaErrorInvalidValue;
  static const bool print = std::getenv("EMU_GRAPH_NODES") != nullptr;
  if (print) std::fprintf(stderr, "cuda emulation: a graph of %zu nodes, %zu kernels\n", g->nodes.size(), g->kernels);
  *exec = new CUgraphExec_st{g->nodes};
  return cudaSuccess;
}
cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t) { return exec ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (!exec) return cudaErrorInvalidValue;
  return emu::submit(s, [exec] {
    for (const Work& w : exec->nodes) w();
  });
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
// No edges kept (the nodes run in capture order): programmatic edges are the device's alone.
cudaError_t cudaGraphGetEdges(cudaGraph_t, cudaGraphNode_t*, cudaGraphNode_t*, cudaGraphEdgeData*, size_t*) {
  return cudaErrorNotSupported;
}
cudaError_t cudaGraphRemoveDependencies(cudaGraph_t, const cudaGraphNode_t*, const cudaGraphNode_t*,
                                        const cudaGraphEdgeData*, size_t) {
  return cudaErrorNotSupported;
}
cudaError_t cudaGraphAddDependencies(cudaGraph_t, const cudaGraphNode_t*, const cudaGraphNode_t*,
                                     const cudaGraphEdgeData*, size_t) {
  return cudaErrorNotSupported;
}
cudaError_t cudaGraphKernelNodeGetParams(cudaGraphNode_t, cudaKernelNodeParams*) { return cudaErrorNotSupported; }
cudaError_t cudaFuncGetName(const char**, const void*) { return cudaErrorNotSupported; }

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
