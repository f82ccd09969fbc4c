// The CPU emulation's scheduler (tests/cuda/emu): a block's threads are fibers (emu_switch.h) on the
// calling OS thread. One warp at a time runs as far as it can alone: each lane until it parks at a
// warp intrinsic or __syncthreads or returns, the warp's complete intrinsic groups released, again,
// until all its lanes wait at the barrier (or are done); then the next warp; when every warp waits,
// the block barrier is released. Nothing to release with threads still parked is a deadlock on the
// GPU too (a lane that skipped a *_sync, a thread that skipped a __syncthreads): reported with
// kernel, block, lanes and file:line, then abort.
// EMU_ORDER=reverse runs a warp's lanes, a block's warps and a grid's blocks last first. The GPU
// fixes none of these orders, so a kernel's bits must not depend on them: a thread that reads what
// another writes without a barrier between (a missing __syncthreads or __syncwarp, a shared buffer
// reused before every warp has read it) reads it fresh in one order and stale in the other, and
// blocks that add floats to one address in arrival order add them in two orders
// (emulate_kernels.sh compares the two runs' copies to the host, case by case).
#include <sys/mman.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "emu_runtime.h"
#include "emu_switch.h"

#if defined(__x86_64__)
// emu_switch_x86_64(save_sp, load_sp): pushes rbp rbx r12-r15, stores rsp in *save_sp, loads
// load_sp and pops the same from there (emu_switch.h's make_context lays them out). The FP control
// words (MXCSR, x87) are not switched: every fiber runs on the one OS thread and no kernel changes
// them, so they are the same in all; loading them (fldcw stalls the pipeline) took 90 % of a switch.
asm(R"(
  .text
  .globl emu_switch_x86_64
  .type emu_switch_x86_64, @function
emu_switch_x86_64:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch_x86_64, .-emu_switch_x86_64
)");
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace emu {
namespace {

enum class State { runnable, at_block, at_warp, done };

struct Fiber {
  Context ctx;
  int stack = -1;  // its stack's index (stack_of) from its first run until it returns
  State st = State::runnable;
  uint3 tid;
  WarpOp op = WarpOp::sync;
  unsigned mask = 0;
  int arg = 0, width = 32;
  uint64_t value = 0, result = 0;
  const uint32_t* gather_in = nullptr;  // warp_gather: this lane's words, and where all lanes' go
  uint32_t* gather_out = nullptr;
  std::source_location at;
  // cp.async: the copies this thread issued and not yet landed, and where each committed group ends
  // in that list (the copies past the last end: not committed yet).
  std::vector<AsyncCopy> copies;
  std::vector<size_t> group_ends;
};

constexpr size_t kStack = 256 * 1024, kGuard = 4096, kMaxThreads = 1024;
constexpr size_t kDefaultShared = 48 * 1024, kMaxShared = 227 * 1024;

struct Grid {
  const char* kernel = "";
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> f;
  Context main;
  int cur = -1;
  std::vector<unsigned char> shared;
} g;

cudaError_t g_last = cudaSuccess;
bool g_reverse = [] {
  const char* o = std::getenv("EMU_ORDER");
  if (o && std::string(o) != "reverse" && std::string(o) != "forward") {
    std::fprintf(stderr, "cuda emulation: EMU_ORDER=%s (forward or reverse)\n", o);
    std::exit(2);
  }
  return o && std::string(o) == "reverse";
}();
// The i-th of n in the run's order.
unsigned nth(unsigned i, unsigned n) { return g_reverse ? n - 1 - i : i; }
std::map<const void*, int> g_max_shared;

char* stack_of(size_t i) {  // 1024 stacks with a guard page under each, mapped once
  static char* base = [] {
    void* p = mmap(nullptr, kMaxThreads * (kStack + kGuard), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) std::abort();
    for (size_t t = 0; t < kMaxThreads; ++t) mprotect(static_cast<char*>(p) + t * (kStack + kGuard), kGuard, PROT_NONE);
    return static_cast<char*>(p);
  }();
  return base + i * (kStack + kGuard) + kGuard;
}

// The stacks not held by a thread, the most recently freed last. A thread takes one at its first
// run and gives it back when it returns, so a kernel whose threads run to the end without parking
// runs every thread on one stack (warm in the caches), and one whose lanes park at shuffles on 32.
std::vector<int> g_free_stacks = [] {
  std::vector<int> v(kMaxThreads);
  for (size_t i = 0; i < kMaxThreads; ++i) v[i] = static_cast<int>(kMaxThreads - 1 - i);
  return v;
}();

// AddressSanitizer (EMU_SANITIZE=1) is told of every stack switch, or it takes a fiber's stack for
// an overflow of the scheduler's.
#if defined(__SANITIZE_ADDRESS__)
const void* g_main_bottom = nullptr;
size_t g_main_size = 0;
void to_fiber(int t) {
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, stack_of(static_cast<size_t>(g.f[t].stack)), kStack);
  switch_context(g.main, g.f[t].ctx);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
}
void to_main(Fiber& f, bool done) {
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(done ? nullptr : &fake, g_main_bottom, g_main_size);
  switch_context(f.ctx, g.main);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
}
void fiber_started() { __sanitizer_finish_switch_fiber(nullptr, &g_main_bottom, &g_main_size); }
// A stack taken from the pool is fresh: a finished thread never returned from fiber_main and the
// frames under its last switch (their scopes' poison, instrumented code's) would stay on it.
void fresh_stack(int i) { ASAN_UNPOISON_MEMORY_REGION(stack_of(static_cast<size_t>(i)), kStack); }
#else
void fresh_stack(int) {}
void to_fiber(int t) { switch_context(g.main, g.f[t].ctx); }
void to_main(Fiber& f, bool) { switch_context(f.ctx, g.main); }
void fiber_started() {}
#endif

[[noreturn]] void report(const char* what);

void fiber_main() {
  fiber_started();
  (*g.body)();
  Fiber& f = g.f[g.cur];
  if (!f.copies.empty()) report("a thread returns with cp.async copies it never waited for");
  f.st = State::done;
  to_main(f, true);  // never resumed
  std::abort();
}

Fiber& self() { return g.f[g.cur]; }
void park(State s) {
  Fiber& f = self();
  f.st = s;
  to_main(f, false);
}

const char* op_name(WarpOp op) {
  static const char* names[] = {"__shfl_sync",   "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                                "__ballot_sync", "__syncwarp",     "ldmatrix / mma"};
  return names[static_cast<int>(op)];
}

std::string where(const Fiber& f) {
  if (f.st == State::done) return "returned";
  if (f.st == State::runnable) return "running";
  std::string s = f.st == State::at_block ? "__syncthreads" : op_name(f.op);
  if (f.st == State::at_warp) {
    char m[16];
    std::snprintf(m, sizeof m, "%08x", f.mask);
    s += std::string(" mask ") + m;
  }
  return s + " at " + f.at.file_name() + ":" + std::to_string(f.at.line());
}

// Every thread's state, lanes of a warp in the same state as one range; then abort.
[[noreturn]] void report(const char* what) {
  std::fprintf(stderr, "cuda emulation: %s in kernel %s, block (%u,%u,%u):\n", what, g.kernel, blockIdx.x, blockIdx.y,
               blockIdx.z);
  const int n = static_cast<int>(g.f.size());
  for (int i = 0; i < n;) {
    int j = i + 1;
    while (j < n && j % 32 != 0 && where(g.f[j]) == where(g.f[i])) ++j;
    if (j - i < 32 || g.f[i].st != State::done)  // whole warps that returned: not listed
      std::fprintf(stderr, "  warp %d lanes %d-%d: %s\n", i / 32, i % 32, (j - 1) % 32, where(g.f[i]).c_str());
    i = j;
  }
  std::abort();
}

int source_lane(const Fiber& f, int lane) {
  const int w = f.width, seg = lane / w * w;
  int src = lane;
  switch (f.op) {
    case WarpOp::shfl: src = seg + ((f.arg % w) + w) % w; break;
    case WarpOp::shfl_up: src = lane - f.arg < seg ? lane : lane - f.arg; break;
    case WarpOp::shfl_down: src = lane + f.arg >= seg + w ? lane : lane + f.arg; break;
    case WarpOp::shfl_xor: src = (lane ^ f.arg) >= seg + w ? lane : lane ^ f.arg; break;
    default: break;
  }
  return src;
}

// Warp w's 32 lanes at one warp_gather (all arrived): each gets every lane's words.
void release_gather(int w) {
  Fiber* lanes = &g.f[static_cast<size_t>(32 * w)];
  const int n = lanes[0].arg;
  for (int j = 0; j < 32; ++j)
    if (lanes[j].arg != n) report("the lanes of a warp gather different word counts (ldmatrix / mma)");
  for (int j = 0; j < 32; ++j) {
    for (int src = 0; src < 32; ++src)
      std::memcpy(lanes[j].gather_out + src * n, lanes[src].gather_in, sizeof(uint32_t) * static_cast<size_t>(n));
    lanes[j].st = State::runnable;
  }
}

// Lane `l` of warp `w` parked at a warp intrinsic: when every lane of its mask is there with the
// same mask and intrinsic, each gets its result and runs again. False: someone is missing.
bool release_group(int w, int l) {
  Fiber& f = g.f[32 * w + l];
  const int n = static_cast<int>(g.f.size());
  if (!(f.mask >> l & 1u)) report("a lane calls a *_sync whose mask leaves it out");
  for (int j = 0; j < 32; ++j) {
    if (!(f.mask >> j & 1u)) continue;
    if (32 * w + j >= n) report("a *_sync mask names a lane the block does not have");
    const Fiber& o = g.f[32 * w + j];
    if (o.st != State::at_warp || o.mask != f.mask) return false;
    if (o.op != f.op) report("the lanes of a *_sync mask wait at different warp intrinsics");
  }
  if (f.op == WarpOp::gather) {
    release_gather(w);
    return true;
  }
  uint64_t ballot = 0;
  for (int j = 0; j < 32; ++j)
    if (f.mask >> j & 1u) ballot |= static_cast<uint64_t>(g.f[32 * w + j].value != 0) << j;
  for (int j = 0; j < 32; ++j) {
    if (!(f.mask >> j & 1u)) continue;
    Fiber& o = g.f[32 * w + j];
    const int src = source_lane(o, j);
    if (!(f.mask >> src & 1u)) report("a shuffle reads a lane outside its mask");
    o.result = o.op == WarpOp::ballot ? ballot : g.f[32 * w + src].value;
    o.st = State::runnable;
  }
  return true;
}

// Warp w's lanes parked at warp intrinsics whose groups are complete: released. Whether any was.
bool release_warp(unsigned w) {
  bool any = false;
  const size_t lo = size_t{32} * w, hi = std::min(g.f.size(), lo + 32);
  for (size_t i = lo; i < hi; ++i)
    if (g.f[i].st == State::at_warp && release_group(static_cast<int>(w), static_cast<int>(i % 32))) any = true;
  return any;
}

// Warp w runs as far as it can without the rest of the block: its runnable lanes (in the run's
// order) each until it parks, its complete warp groups released, again, until every lane waits at
// __syncthreads, has returned or waits for a lane that cannot come.
void run_warp(unsigned w, unsigned threads) {
  const unsigned lo = 32 * w, n = std::min(threads - lo, 32u);
  do {
    for (unsigned i = 0; i < n; ++i) {
      const unsigned t = lo + nth(i, n);
      if (g.f[t].st != State::runnable) continue;
      Fiber& f = g.f[t];
      if (f.stack < 0) {
        f.stack = g_free_stacks.back();
        g_free_stacks.pop_back();
        fresh_stack(f.stack);
        make_context(f.ctx, stack_of(static_cast<size_t>(f.stack)), kStack, fiber_main);
      }
      g.cur = static_cast<int>(t);
      threadIdx = f.tid;
      to_fiber(static_cast<int>(t));
      if (f.st == State::done) g_free_stacks.push_back(std::exchange(f.stack, -1));
    }
  } while (release_warp(w));
}

bool release_block() {
  bool waiting = false;
  for (const Fiber& f : g.f) {
    if (f.st == State::at_warp) return false;
    waiting = waiting || f.st == State::at_block;
  }
  for (Fiber& f : g.f)
    if (f.st == State::at_block) f.st = State::runnable;
  return waiting;
}

void run_block(unsigned threads) {
  g.f.assign(threads, Fiber{});
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = g.f[t];
    f.tid = {t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y)};
  }
  std::fill(g.shared.begin(), g.shared.end(), 0xff);
  const unsigned warps = (threads + 31) / 32;
  for (;;) {  // each warp up to the block's next barrier, one warp after another
    for (unsigned i = 0; i < warps; ++i) run_warp(nth(i, warps), threads);
    bool alive = false;
    for (const Fiber& f : g.f) alive = alive || f.st != State::done;
    if (!alive) return;
    if (!release_block()) report("deadlock");
  }
}

cudaError_t check_config(const void* fn, const Config& c) {
  const uint64_t threads = uint64_t{c.block.x} * c.block.y * c.block.z;
  if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || c.grid.x > 0x7fffffffu || c.grid.y > 65535 ||
      c.grid.z > 65535 || threads == 0 || threads > kMaxThreads || c.block.z > 64)
    return cudaErrorInvalidConfiguration;
  if (threads > c.max_threads) return cudaErrorLaunchOutOfResources;
  const auto it = g_max_shared.find(fn);
  const size_t limit = it == g_max_shared.end() ? kDefaultShared : static_cast<size_t>(it->second);
  if (c.shared > limit || c.shared > kMaxShared) return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace

bool set_reverse_order(bool reverse) {
  const bool was = g_reverse;
  g_reverse = reverse;
  return was;
}

cudaError_t take_last_error() { const cudaError_t e = g_last; g_last = cudaSuccess; return e; }
void set_last_error(cudaError_t e) { g_last = e; }
const char* error_name(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorECCUncorrectable:
      return "cudaErrorECCUncorrectable";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchTimeout:
      return "cudaErrorLaunchTimeout";
    case cudaErrorAssert:
      return "cudaErrorAssert";
    case cudaErrorHardwareStackError:
      return "cudaErrorHardwareStackError";
    case cudaErrorIllegalInstruction:
      return "cudaErrorIllegalInstruction";
    case cudaErrorMisalignedAddress:
      return "cudaErrorMisalignedAddress";
    case cudaErrorInvalidAddressSpace:
      return "cudaErrorInvalidAddressSpace";
    case cudaErrorInvalidPc:
      return "cudaErrorInvalidPc";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    default: return "cudaErrorLaunchFailure";
  }
}
void set_max_dynamic_shared(const void* fn, int bytes) {
  if (bytes < 0 || static_cast<size_t>(bytes) > kMaxShared) g_last = cudaErrorInvalidValue;
  else g_max_shared[fn] = bytes;
}

void* dynamic_shared_bytes() {
  if (g.shared.empty()) report("extern __shared__ read by a kernel launched with 0 bytes of it");
  return g.shared.data();
}
size_t dynamic_shared_size() { return g.shared.size(); }

void async_copy(const AsyncCopy& c, const std::source_location& at) {
  const auto n = static_cast<size_t>(c.bytes);
  if (c.bytes != 4 && c.bytes != 8 && c.bytes != 16) ptx_report("cp.async: a copy size other than 4, 8 or 16", at);
  if (c.shared_offset % n != 0 || reinterpret_cast<uintptr_t>(c.src) % n != 0)
    ptx_report("cp.async: a copy from or to an address that is not aligned to its size", at);
  if (c.shared_offset + n > g.shared.size()) ptx_report("cp.async: a copy past the dynamic shared memory", at);
  if (c.src_bytes < 0 || c.src_bytes > c.bytes) ptx_report("cp.async: a source size outside 0 .. the copy size", at);
  self().copies.push_back(c);
}

void async_commit() {
  Fiber& f = self();
  f.group_ends.push_back(f.copies.size());
}

// The groups but the newest `pending` land, in issue order: the source bytes as they are now (the
// latest a GPU could read them), the rest of each copy zero.
void async_wait(int pending) {
  Fiber& f = self();
  if (static_cast<int>(f.group_ends.size()) <= pending) return;
  const size_t groups = f.group_ends.size() - static_cast<size_t>(pending), n = f.group_ends[groups - 1];
  unsigned char* shared = g.shared.data();
  for (size_t i = 0; i < n; ++i) {
    const AsyncCopy& c = f.copies[i];
    std::memset(shared + c.shared_offset, 0, static_cast<size_t>(c.bytes));
    std::memcpy(shared + c.shared_offset, c.src, static_cast<size_t>(c.src_bytes));
  }
  f.copies.erase(f.copies.begin(), f.copies.begin() + static_cast<std::ptrdiff_t>(n));
  f.group_ends.erase(f.group_ends.begin(), f.group_ends.begin() + static_cast<std::ptrdiff_t>(groups));
  for (size_t& e : f.group_ends) e -= n;
}

void ptx_report(const char* what, const std::source_location& at) {
  const std::string m = std::string(what) + " at " + at.file_name() + ":" + std::to_string(at.line()) + " (thread " +
                        std::to_string(threadIdx.x) + ")";
  report(m.c_str());
}

uint64_t warp_exchange(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const std::source_location& at) {
  Fiber& f = self();
  if (width < 1 || width > 32 || (width & (width - 1))) report("a shuffle width that is not a power of two <= 32");
  f.op = op, f.mask = mask, f.value = value, f.arg = arg, f.width = width, f.at = at;
  park(State::at_warp);
  return self().result;
}

void warp_gather(const uint32_t* mine, int n, uint32_t* all, const std::source_location& at) {
  Fiber& f = self();
  f.op = WarpOp::gather, f.mask = 0xffffffffu, f.arg = n, f.width = 32, f.at = at;
  f.gather_in = mine, f.gather_out = all;
  park(State::at_warp);
}

void block_barrier(const std::source_location& at) {
  self().at = at;
  park(State::at_block);
}

cudaError_t check_launch(const void* fn, const Config& c) { return check_config(fn, c); }

WorkCounts& work_counts() {
  static WorkCounts w;
  return w;
}

GridHook& grid_hook() {
  static GridHook hook = nullptr;
  return hook;
}

static uint64_t steady_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

void run_grid(const char* kernel, const void* fn, const Config& c, const std::function<void()>& body) {
  const cudaError_t e = check_config(fn, c);
  if (e != cudaSuccess) {
    g_last = e;
    return;
  }
  ++work_counts().kernels;
  const uint64_t start = grid_hook() ? steady_ns() : 0;
  g.kernel = kernel;
  g.body = &body;
  g.shared.assign(c.shared, 0xff);
  gridDim = c.grid;
  blockDim = c.block;
  const unsigned threads = c.block.x * c.block.y * c.block.z;
  for (unsigned z = 0; z < c.grid.z; ++z)
    for (unsigned y = 0; y < c.grid.y; ++y)
      for (unsigned x = 0; x < c.grid.x; ++x) {
        blockIdx = {nth(x, c.grid.x), nth(y, c.grid.y), nth(z, c.grid.z)};
        run_block(threads);
      }
  g.body = nullptr;
  if (GridHook hook = grid_hook()) hook(kernel, c.stream, start, steady_ns());
}

}  // namespace emu
