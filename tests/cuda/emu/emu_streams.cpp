// The CUDA runtime's streams, events and graphs on the CPU (tests/cuda/emu/include/emu_runtime.h;
// memory and copies: emu_memory.cpp).
// Work runs when submitted, except on a stream that is capturing: then it is recorded, as a graph
// node is, with the launch arguments of that moment, and runs at every cudaGraphLaunch. A capture
// follows the device's rules that the decoder's graphs depend on:
//   - a stream joins a capture by waiting on an event recorded in it (a fork), and must be joined
//     back (the origin, or a stream of the capture, waits on an event recorded after its last
//     work) before cudaStreamEndCapture: else cudaErrorStreamCaptureUnjoined;
//   - the legacy stream (null) during a capture: cudaErrorStreamCaptureImplicit;
//   - a blocking call (cudaMalloc, cudaFree, cudaMemcpy, cudaMemset, a synchronize) during a
//     global or thread-local capture: cudaErrorStreamCaptureUnsupported, as is an asynchronous
//     copy to or from pageable host memory (a graph's copies are DMA transfers: pinned, registered
//     or device memory only; emu_memory.cpp);
// each of which invalidates the capture: cudaStreamEndCapture then gives no graph and
// cudaErrorStreamCaptureInvalidated. The emulation is single-threaded: "this thread" is the process.
// EMU_STREAMS=lazy: work on any stream (the legacy one too) is queued and runs only when something
// waits for it (a synchronize, an event waited for or synchronized, a synchronous copy behind the
// legacy stream's barrier with the blocking streams, a copy to pageable memory, cudaFree), as late
// as a GPU may run it. So a kernel that reads what another stream writes without waiting for it
// reads the old bytes, and a host that refills a pinned buffer before the copy reading it has run
// sends the new ones: the missing dependency changes the case's bits, where the eager order hides it.
// Without it the queues stay empty, so the synchronizing calls' runs of them are no-ops.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
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

// EMU_STREAMS=lazy's queue entry: work, or a wait for stream `stream`'s first `upto` entries.
struct Queued {
  Work work;
  long stream = 0, upto = 0;
};

struct CUstream_st {
  unsigned flags = 0;
  std::shared_ptr<Capture> capture;  // the capture it is part of, if any
  long id = 0;                       // EMU_STREAMS=lazy: its key in g_streams (never reused)
  std::deque<Queued> queue;          // submitted, not yet run
  long submitted = 0, ran = 0;       // entries ever queued; run
};
// When an event's record ran. Each record has its own, shared with the work that sets it, so a
// record still queued (EMU_STREAMS=lazy) or in a graph outlives a cudaEventDestroy, as on the GPU.
struct EventMark {
  bool recorded = false;
  Clock::time_point at{};
};
struct CUevent_st {
  unsigned flags = 0;
  std::shared_ptr<EventMark> mark = std::make_shared<EventMark>();  // the latest record's
  std::shared_ptr<Capture> capture;  // recorded during this capture: a node of it
  cudaStream_t stream = nullptr;     // where it was recorded, with the work that stream had by then
  long work = 0;
  long lazy_stream = -1, lazy_upto = 0;  // EMU_STREAMS=lazy: recorded after that stream's first upto entries
};

namespace {

std::set<std::shared_ptr<Capture>> g_captures;  // active captures

bool g_lazy = [] {
  const char* v = std::getenv("EMU_STREAMS");
  return v && std::strcmp(v, "lazy") == 0;
}();
CUstream_st g_legacy;                                    // the legacy (null) stream's queue, id 0
std::map<long, cudaStream_t> g_streams{{0, &g_legacy}};  // its and the live created streams' by id
long g_next_stream = 1;
cudaStream_t queue_of(cudaStream_t s) { return s ? s : &g_legacy; }

// Runs stream id's queue until its first `upto` entries have run (a destroyed stream ran them all).
void run_until(long id, long upto) {
  auto it = g_streams.find(id);
  if (it == g_streams.end()) return;
  cudaStream_t s = it->second;
  while (s->ran < upto && !s->queue.empty()) {
    Queued q = std::move(s->queue.front());
    s->queue.pop_front();
    if (q.work)
      q.work();
    else
      run_until(q.stream, q.upto);
    ++s->ran;
  }
}
void run_all(cudaStream_t s) { run_until(s->id, s->submitted); }
// Queues on q a wait for stream `stream`'s first `upto` entries.
void push_wait(cudaStream_t q, long stream, long upto) {
  q->queue.push_back({Work{}, stream, upto});
  ++q->submitted;
}
// Queues work on s (the legacy stream: null) behind the legacy stream's barrier: legacy work after
// every blocking stream's work so far, a blocking stream's after the legacy stream's so far.
void enqueue(cudaStream_t s, Work work) {
  cudaStream_t q = queue_of(s);
  auto wait_for = [q](cudaStream_t other) {
    if (other->ran < other->submitted) push_wait(q, other->id, other->submitted);
  };
  if (!s)
    for (const auto& [id, b] : g_streams)
      if (id != 0 && !(b->flags & cudaStreamNonBlocking)) wait_for(b);
  if (s && !(s->flags & cudaStreamNonBlocking)) wait_for(&g_legacy);
  q->queue.push_back({std::move(work)});
  ++q->submitted;
}
// Every stream's queue (blocking_only: the legacy stream's and those it waits for, not
// cudaStreamNonBlocking's: a synchronous cudaMemcpy or cudaMemset).
void drain(bool blocking_only) {
  std::vector<cudaStream_t> all;
  for (const auto& [id, s] : g_streams)
    if (!blocking_only || !(s->flags & cudaStreamNonBlocking)) all.push_back(s);
  for (cudaStream_t s : all) run_all(s);
}

void invalidate_all() {
  for (const auto& c : g_captures) c->invalid = true;
}

bool forbids_blocking() {
  for (const auto& c : g_captures)
    if (c->mode != cudaStreamCaptureModeRelaxed) return true;
  return false;
}

}  // namespace

namespace emu {

bool lazy_streams() { return g_lazy; }
void drain_streams(bool blocking_only) { drain(blocking_only); }
void run_stream(cudaStream_t s) { run_all(queue_of(s)); }
bool capturing(cudaStream_t s) { return s && s->capture; }

bool set_lazy_streams(bool lazy) {
  drain(false);  // what is queued runs before the mode changes
  const bool was = g_lazy;
  g_lazy = lazy;
  return was;
}

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
  if (g_lazy) {
    enqueue(s, std::move(work));
    return cudaSuccess;
  }
  work();
  return cudaSuccess;
}

uint64_t g_host_waits = 0;
uint64_t host_waits() { return g_host_waits; }
void note_host_wait() { ++g_host_waits; }

cudaError_t blocking_call(cudaStream_t s) {
  if ((s && s->capture) || forbids_blocking()) {
    invalidate_all();
    return cudaErrorStreamCaptureUnsupported;
  }
  return cudaSuccess;
}

}  // namespace emu

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  return emu::submit(s, [=] { fn(data); });
}

cudaError_t cudaDeviceSynchronize() {
  if (const cudaError_t e = emu::blocking_call()) return e;
  emu::note_host_wait();
  drain(false);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (const cudaError_t e = emu::blocking_call(s)) return e;
  emu::note_host_wait();
  run_all(queue_of(s));
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  *s = new CUstream_st;
  (*s)->flags = flags;
  (*s)->id = g_next_stream++;
  g_streams[(*s)->id] = *s;
  return cudaSuccess;
}
// Priorities order nothing here (work runs at the call or when awaited): the range of an H100's, kept.
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int priority) {
  if (priority > 0 || priority < -5) return cudaErrorInvalidValue;
  return cudaStreamCreateWithFlags(s, flags);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (s->capture) {
    s->capture->invalid = true;
    s->capture->work.erase(s);
  }
  run_all(s);  // its queued work still runs (EMU_STREAMS=lazy)
  g_streams.erase(s->id);
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
  auto mark = std::make_shared<EventMark>();
  const cudaError_t r = emu::submit(s, [mark] {
    mark->recorded = true;
    mark->at = Clock::now();
  });
  if (r != cudaSuccess) return r;
  e->mark = mark;
  e->capture = s ? s->capture : nullptr;
  e->stream = s;
  e->work = e->capture ? e->capture->work[s] : 0;
  const bool queued = g_lazy && !e->capture;
  const cudaStream_t q = queue_of(s);
  e->lazy_stream = queued ? q->id : -1;
  e->lazy_upto = queued ? q->submitted : 0;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (!e) return cudaErrorInvalidResourceHandle;
  if (!e->capture) {  // an event of work outside a capture: finished, or queued (EMU_STREAMS=lazy)
    if (s && s->capture && s->capture->invalid) return cudaErrorStreamCaptureInvalidated;
    if (e->lazy_stream >= 0 && !(s && s->capture))
      push_wait(queue_of(s), e->lazy_stream, e->lazy_upto);
    else if (e->lazy_stream >= 0)  // a capture: the event's work first
      run_until(e->lazy_stream, e->lazy_upto);
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
  if (const cudaError_t r = emu::blocking_call(e->capture ? e->stream : nullptr)) return r;
  emu::note_host_wait();
  if (e->lazy_stream >= 0) run_until(e->lazy_stream, e->lazy_upto);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!a || !b || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming))
    return cudaErrorInvalidResourceHandle;
  if (!a->mark->recorded || !b->mark->recorded) return cudaErrorInvalidResourceHandle;
  *ms = std::chrono::duration<float, std::milli>(b->mark->at - a->mark->at).count();
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
