// The GPU's own work, kernel by kernel: `JTOK_KERNEL_TRACE=FILE jtok bench-train|bench-decode
// --device cuda` (kernel_trace_file.h) records every kernel, copy and memset the device runs between
// a start and a stop, with the device's timestamps, from CUPTI's activity records (libcupti loaded
// with dlopen, as cuBLASLt: no link, no cost to a process that does not trace), and writes them as
// CSV (trace_csv), one row each.
// bench/gpu_kernels_report.py sums them by kernel and kind of op beside the PyTorch peer's trace
// (tests/reference/train_bench.py --kernel-trace). Host code; includable from g++. A build without
// CUDA has these too: start says why it cannot trace, parse refuses.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace jtok::cuda {

// One span of device work: kind "kernel", "memcpy HtoD" (DtoH, DtoD, HtoH, PtoP), or "memset".
struct TraceRecord {
  std::string kind;
  uint32_t stream = 0;
  uint64_t start_ns = 0, end_ns = 0;  // the device's clock
  std::string name;                   // a kernel's name demangled; a copy's or memset's bytes
};

// Starts recording the device's work: "" when it does, else why not (no libcupti found, CUPTI's
// refusal, a build without CUDA). One trace a process at a time.
std::string kernel_trace_start();
// Waits for the device, stops, and returns the records since the start (empty when none started);
// dropped (if given): records CUPTI dropped (0 unless its buffers overflowed).
std::vector<TraceRecord> kernel_trace_stop(uint64_t* dropped = nullptr);

// The records in `valid` bytes of CUPTI activity records (kernels, copies, memsets; other kinds
// skipped): the trace's own walk of each buffer CUPTI completes.
void parse_activity_records(uint8_t* buffer, size_t valid, std::vector<TraceRecord>& out);
// A buffer of CUPTI's own record types holding `records` (for tests of the walk above).
std::vector<uint8_t> activity_records_for_test(const std::vector<TraceRecord>& records);

// CSV text: "# " + comment, then "kind,stream,start_ns,end_ns,name" and a row a record (the name
// quoted: C++ names hold commas).
std::string trace_csv(const std::vector<TraceRecord>& records, const std::string& comment);

}  // namespace jtok::cuda
