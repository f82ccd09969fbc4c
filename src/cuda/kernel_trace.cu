// The device's work recorded by CUPTI's activity API (src/cuda/kernel_trace.h). libcupti is loaded
// with dlopen on the first start: a process that never traces never maps it. Records arrive in
// buffers CUPTI fills and hands back on its own thread (buffer_completed), walked with its
// cuptiActivityGetNextRecord into TraceRecords under a mutex.
#include <cuda_runtime_api.h>
#include <cupti_activity.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "cuda/kernel_trace.h"

namespace jtok::cuda {

namespace {

struct CuptiApi {
  decltype(&cuptiActivityRegisterCallbacks) RegisterCallbacks = nullptr;
  decltype(&cuptiActivityEnable) Enable = nullptr;
  decltype(&cuptiActivityDisable) Disable = nullptr;
  decltype(&cuptiActivityFlushAll) FlushAll = nullptr;
  decltype(&cuptiActivityGetNextRecord) GetNextRecord = nullptr;
  decltype(&cuptiActivityGetNumDroppedRecords) GetNumDroppedRecords = nullptr;
  decltype(&cuptiGetResultString) GetResultString = nullptr;
};

// JTOK_CUPTI (a path), libcupti.so.<CUDA major> and libcupti.so on the loader's path, then the
// toolkit's usual homes. "" and api filled, or why none loaded.
std::string load_cupti(CuptiApi& api) {
  const std::string versioned = "libcupti.so." + std::to_string(CUDART_VERSION / 1000);
  std::vector<std::string> names = {versioned, "libcupti.so", "/usr/local/cuda/extras/CUPTI/lib64/" + versioned,
                                    "/usr/local/cuda/lib64/" + versioned};
  if (const char* p = std::getenv("JTOK_CUPTI"); p && *p) names.insert(names.begin(), p);
  void* lib = nullptr;
  std::string why;
  for (const std::string& n : names) {
    if ((lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
    const char* e = dlerror();
    why += (why.empty() ? "" : "; ") + std::string(e ? e : n + ": not found");
  }
  if (!lib) return "libcupti could not be loaded (" + why + "): set JTOK_CUPTI to its path";
  const auto find = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn) why = std::string("libcupti lacks ") + name;
  };
  why.clear();
  find(api.RegisterCallbacks, "cuptiActivityRegisterCallbacks");
  find(api.Enable, "cuptiActivityEnable");
  find(api.Disable, "cuptiActivityDisable");
  find(api.FlushAll, "cuptiActivityFlushAll");
  find(api.GetNextRecord, "cuptiActivityGetNextRecord");
  find(api.GetNumDroppedRecords, "cuptiActivityGetNumDroppedRecords");
  find(api.GetResultString, "cuptiGetResultString");
  return why;
}

struct Trace {
  std::mutex mu;
  CuptiApi api;
  std::string load_error;
  bool loaded = false, registered = false, on = false;
  std::vector<TraceRecord> records;
  uint64_t dropped = 0;
} g_trace;

const CuptiApi& cupti_or_fail() {
  std::lock_guard<std::mutex> lock(g_trace.mu);
  if (!g_trace.loaded) g_trace.load_error = load_cupti(g_trace.api), g_trace.loaded = true;
  if (!g_trace.load_error.empty()) fail("kernel trace: ", g_trace.load_error);
  return g_trace.api;
}

std::string result_text(CUptiResult r) {
  const char* s = nullptr;
  if (g_trace.api.GetResultString) g_trace.api.GetResultString(r, &s);
  return s ? s : "CUPTI error " + std::to_string(static_cast<int>(r));
}

std::string demangled(const char* name) {
  if (!name) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : name;
  std::free(d);
  return out;
}

const char* copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "memcpy PtoP";
    default:
      return "memcpy";
  }
}

constexpr size_t kBufferBytes = 8 << 20;  // ~40,000 kernel records

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = kBufferBytes;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));  // CUPTI's alignment: 8 bytes
  *max_records = 0;                                                      // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  std::vector<TraceRecord> got;
  parse_activity_records(buffer, valid, got);
  size_t dropped = 0;
  g_trace.api.GetNumDroppedRecords(ctx, stream, &dropped);
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_trace.mu);
  g_trace.records.insert(g_trace.records.end(), got.begin(), got.end());
  g_trace.dropped += dropped;
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};
constexpr const char* kKindNames[] = {"CONCURRENT_KERNEL", "MEMCPY", "MEMSET"};

}  // namespace

std::string kernel_trace_start() {
  try {
    const CuptiApi& api = cupti_or_fail();
    if (g_trace.on) return "a kernel trace is already running";
    if (!g_trace.registered) {
      const CUptiResult r = api.RegisterCallbacks(buffer_requested, buffer_completed);
      if (r != CUPTI_SUCCESS) return "cuptiActivityRegisterCallbacks: " + result_text(r);
      g_trace.registered = true;
    }
    for (size_t i = 0; i < std::size(kKinds); ++i) {
      const CUptiResult r = api.Enable(kKinds[i]);
      if (r != CUPTI_SUCCESS) {
        for (CUpti_ActivityKind k : kKinds) api.Disable(k);
        return std::string("cuptiActivityEnable(CUPTI_ACTIVITY_KIND_") + kKindNames[i] + "): " + result_text(r) +
               " (no GPU or driver?)";
      }
    }
    g_trace.on = true;
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

std::vector<TraceRecord> kernel_trace_stop(uint64_t* dropped) {
  if (!g_trace.on) return {};
  cudaDeviceSynchronize();  // every recorded span has ended
  g_trace.api.FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  for (CUpti_ActivityKind k : kKinds) g_trace.api.Disable(k);
  g_trace.api.FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  g_trace.on = false;
  std::lock_guard<std::mutex> lock(g_trace.mu);
  if (dropped) *dropped = g_trace.dropped;
  g_trace.dropped = 0;
  return std::exchange(g_trace.records, {});
}

void parse_activity_records(uint8_t* buffer, size_t valid, std::vector<TraceRecord>& out) {
  const CuptiApi& api = cupti_or_fail();
  CUpti_Activity* rec = nullptr;
  while (valid > 0 && api.GetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    TraceRecord t;
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      t = {"kernel", k->streamId, k->start, k->end, demangled(k->name)};
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      t = {copy_kind(m->copyKind), m->streamId, m->start, m->end, std::to_string(m->bytes) + " bytes"};
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      t = {"memset", m->streamId, m->start, m->end, std::to_string(m->bytes) + " bytes"};
    } else {
      continue;
    }
    out.push_back(std::move(t));
  }
}

std::vector<uint8_t> activity_records_for_test(const std::vector<TraceRecord>& records) {
  static std::deque<std::string> names;  // the kernel records point at these (a deque: they stay put)
  std::vector<uint8_t> buf;
  const auto append = [&](const auto& r) {
    const size_t at = buf.size();
    buf.resize(at + (sizeof r + 7) / 8 * 8);
    std::memcpy(buf.data() + at, &r, sizeof r);
  };
  for (const TraceRecord& t : records) {
    if (t.kind == "kernel") {
      names.push_back(t.name);
      CUpti_ActivityKernel10 k{};
      k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, k.streamId = t.stream, k.start = t.start_ns, k.end = t.end_ns;
      k.name = names.back().c_str();
      append(k);
    } else if (t.kind == "memset") {
      CUpti_ActivityMemset4 m{};
      m.kind = CUPTI_ACTIVITY_KIND_MEMSET, m.streamId = t.stream, m.start = t.start_ns, m.end = t.end_ns;
      m.bytes = std::strtoull(t.name.c_str(), nullptr, 10);
      append(m);
    } else {
      CUpti_ActivityMemcpy6 m{};
      m.kind = CUPTI_ACTIVITY_KIND_MEMCPY, m.streamId = t.stream, m.start = t.start_ns, m.end = t.end_ns;
      m.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
      m.bytes = std::strtoull(t.name.c_str(), nullptr, 10);
      append(m);
    }
  }
  return buf;
}

}  // namespace jtok::cuda
