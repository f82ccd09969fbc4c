// src/cuda/kernel_trace.h on the emulated GPU (kernel_trace.cu is left out: CUPTI records a real
// device's work): the trace records the grids the emulator runs (emu::grid_hook), a kernel each, with
// the host's clock around the run and the stream's ordinal in the order first seen; no copies or
// memsets. So `JTOK_KERNEL_TRACE`'s callers, their files and the report run here as on a GPU.
#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "core/error.h"
#include "cuda/kernel_trace.h"
#include "emu_runtime.h"

namespace jtok::cuda {

namespace {

struct EmuTrace {
  std::mutex mu;
  std::vector<TraceRecord> records;
  std::map<cudaStream_t, uint32_t> streams;
};

EmuTrace& emu_trace() {
  static EmuTrace t;
  return t;
}

void record_grid(const char* kernel, cudaStream_t s, uint64_t start_ns, uint64_t end_ns) {
  EmuTrace& t = emu_trace();
  std::lock_guard<std::mutex> lock(t.mu);
  const uint32_t stream = t.streams.emplace(s, static_cast<uint32_t>(t.streams.size())).first->second;
  t.records.push_back({"kernel", stream, start_ns, end_ns, kernel});
}

}  // namespace

std::string kernel_trace_start() {
  if (emu::grid_hook()) return "a kernel trace is already running in this process";
  EmuTrace& t = emu_trace();
  std::lock_guard<std::mutex> lock(t.mu);
  t.records.clear();
  t.streams.clear();
  emu::grid_hook() = record_grid;
  return "";
}

std::vector<TraceRecord> kernel_trace_stop(uint64_t* dropped) {
  if (dropped) *dropped = 0;
  if (!emu::grid_hook()) return {};
  cudaDeviceSynchronize();  // the queued work (EMU_STREAMS=lazy) runs, and is recorded
  emu::grid_hook() = nullptr;
  EmuTrace& t = emu_trace();
  std::lock_guard<std::mutex> lock(t.mu);
  return std::move(t.records);
}

void parse_activity_records(uint8_t*, size_t, std::vector<TraceRecord>&) {
  fail("kernel trace: no CUPTI on the emulated GPU");
}
std::vector<uint8_t> activity_records_for_test(const std::vector<TraceRecord>&) {
  fail("kernel trace: no CUPTI on the emulated GPU");
}

}  // namespace jtok::cuda
