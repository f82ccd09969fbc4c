// src/cuda/kernel_trace.h on the emulated GPU (kernel_trace.cu is left out: CUPTI records a real
// device's work): a trace cannot start, and says so; `JTOK_KERNEL_TRACE` runs go on without one.
#include "core/error.h"
#include "cuda/kernel_trace.h"

namespace jtok::cuda {

std::string kernel_trace_start() { return "CUPTI records a GPU's work, and this is the emulated one"; }
std::vector<TraceRecord> kernel_trace_stop(uint64_t*) { return {}; }
void parse_activity_records(uint8_t*, size_t, std::vector<TraceRecord>&) {
  fail("kernel trace: no CUPTI on the emulated GPU");
}
std::vector<uint8_t> activity_records_for_test(const std::vector<TraceRecord>&) {
  fail("kernel trace: no CUPTI on the emulated GPU");
}

}  // namespace jtok::cuda
