// A kernel trace's CSV (src/cuda/kernel_trace.h): plain text, in every build.
#include <string>

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

}  // namespace jtok::cuda
