// A kernel trace's CSV and file (src/cuda/kernel_trace.h, kernel_trace_file.h): plain text, in every build.
#include "cuda/kernel_trace_file.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/atomic_file.h"
#include "cuda/kernel_trace.h"

namespace jtok::cuda {

std::string trace_csv(const std::vector<TraceRecord>& records, const std::string& comment) {
  std::string out = "# " + comment + "\nkind,stream,start_ns,end_ns,name\n";
  for (const TraceRecord& r : records) {
    out += r.kind + "," + std::to_string(r.stream) + "," + std::to_string(r.start_ns) + "," + std::to_string(r.end_ns) +
           ",\"";
    for (char c : r.name) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    out += "\"\n";
  }
  return out;
}

std::string kernel_trace_path_from_env() {
  const char* path = std::getenv("JTOK_KERNEL_TRACE");
  return path ? path : "";
}

KernelTraceFile begin_kernel_trace(const std::string& path, bool cuda, const std::string& tool) {
  KernelTraceFile t;
  t.path = path;
  if (path.empty()) return t;
  t.error = cuda ? kernel_trace_start() : "it traces a GPU: --device cuda only";
  t.on = t.error.empty();
  if (!t.on)
    std::fprintf(stderr, "%s: JTOK_KERNEL_TRACE=%s: no trace (%s)\n", tool.c_str(), path.c_str(), t.error.c_str());
  return t;
}

void end_kernel_trace(KernelTraceFile& t, const std::string& tool, const std::string& what, int64_t steps) {
  if (!t.on) return;
  t.on = false;
  const std::vector<TraceRecord> records = kernel_trace_stop(&t.dropped);
  t.records = records.size();
  t.steps = steps;
  write_file_atomic(
      t.path, trace_csv(records, what + ", steps " + std::to_string(steps) + ", dropped " + std::to_string(t.dropped)));
  std::fprintf(stderr, "%s: kernel trace of %s: %zu records (%llu dropped) -> %s\n", tool.c_str(), what.c_str(),
               t.records, static_cast<unsigned long long>(t.dropped), t.path.c_str());
}

nlohmann::json kernel_trace_json(const KernelTraceFile& t) {
  if (t.path.empty()) return nullptr;
  if (!t.error.empty()) return {{"file", t.path}, {"error", t.error}};
  return {{"file", t.path}, {"records", t.records}, {"dropped", t.dropped}, {"steps", t.steps}};
}

}  // namespace jtok::cuda
