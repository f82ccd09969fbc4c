// The GPU decoder's step profile (cuda/decoder.h's StepBreakdown): timing cudaEvents recorded on the
// decoder's stream between a decode step's phases, read after the step's sync. Eager steps only (a
// captured event is a graph node, not a time). Host code; includable from g++.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "cuda/decoder.h"

namespace jtok::cuda {

// Where a mark sits in a step: once a step (step_begin: before the ids go up; head_begin / head_end
// around the final norm and LM head; digest_end: after the logit digests, right after head_end when
// the step takes none; copy_end: the logits or digests on the host) or once a layer (layer_begin,
// attention_end; wait_begin / wait_end around the wait for the layer's table rows, where it reads any).
enum class StepMark { step_begin, head_begin, head_end, copy_end, digest_end, layer_begin, attention_end, wait_begin, wait_end };

class DecodeProfiler {
 public:
  explicit DecodeProfiler(int64_t layers);
  ~DecodeProfiler();
  DecodeProfiler(const DecodeProfiler&) = delete;
  DecodeProfiler& operator=(const DecodeProfiler&) = delete;

  void begin_step();  // forgets the last step's waits and host time
  // Records the mark's event on `stream` (layer: the layer of a per-layer mark, else ignored).
  void mark(StepMark m, int64_t layer, cudaStream_t stream);
  void add_issue_ms(double ms) { issue_ms_ += ms; }  // host time queuing the rows' requests
  // After the step's copy_end has completed: the GPU phases and rows_issue_ms (rows_dedup,
  // rows_gather, rows, max_len and host_ms are the caller's).
  StepBreakdown read() const;

 private:
  cudaEvent_t event(StepMark m, int64_t layer) const;
  float ms(StepMark a, int64_t la, StepMark b, int64_t lb) const;

  int64_t layers_ = 0;
  std::vector<cudaEvent_t> events_;  // 5 once a step, then 4 a layer
  std::vector<uint8_t> waited_;      // per layer: its wait marks recorded this step
  double issue_ms_ = 0;
};

}  // namespace jtok::cuda
