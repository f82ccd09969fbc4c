// A bench's kernel trace file: `JTOK_KERNEL_TRACE=FILE jtok bench-train|bench-decode --device cuda`
// (cuda/kernel_trace.h records the device's work; this begins it where the run is on a GPU and ends
// it by writing the records as CSV: a temporary name, fsync, rename). Host code, in every build.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace jtok::cuda {

struct KernelTraceFile {
  std::string path;   // "" where none was asked for
  std::string error;  // why no trace ran
  bool on = false;    // recording, between begin and end
  size_t records = 0;
  uint64_t dropped = 0;
  int64_t steps = 0;  // what the trace's time is divided by (its header says "steps N")
};

// JTOK_KERNEL_TRACE's file ("" when unset).
std::string kernel_trace_path_from_env();
// Starts recording to `path` ("" : nothing) where `cuda`, else says why not on stderr, as `tool`.
KernelTraceFile begin_kernel_trace(const std::string& path, bool cuda, const std::string& tool);
// Stops, and writes the records with "# <what>, steps <steps>, dropped <n>" as their first line.
void end_kernel_trace(KernelTraceFile& t, const std::string& tool, const std::string& what, int64_t steps);
// For a report line: {file, records, dropped, steps} or {file, error}; null where none was asked for.
nlohmann::json kernel_trace_json(const KernelTraceFile& t);

}  // namespace jtok::cuda
