// The GPU decoder's step profile (src/cuda/decoder_profile.h).
#include "cuda/decoder_profile.h"

#include "core/error.h"
#include "cuda/check.h"

namespace jtok::cuda {

namespace {

constexpr int64_t kStepMarks = 5;   // step_begin, head_begin, head_end, copy_end, digest_end
constexpr int64_t kLayerMarks = 4;  // layer_begin, attention_end, wait_begin, wait_end

}  // namespace

DecodeProfiler::DecodeProfiler(int64_t layers) : layers_(layers) {
  JTOK_CHECK(layers > 0, "DecodeProfiler: ", layers, " layers");
  events_.assign(static_cast<size_t>(kStepMarks + kLayerMarks * layers), nullptr);
  for (cudaEvent_t& e : events_) JTOK_CUDA_CHECK(cudaEventCreate(&e));  // timing events
  waited_.assign(static_cast<size_t>(layers), 0);
}

DecodeProfiler::~DecodeProfiler() {
  for (cudaEvent_t e : events_)
    if (e) cudaEventDestroy(e);
}

cudaEvent_t DecodeProfiler::event(StepMark m, int64_t layer) const {
  const int64_t i = static_cast<int64_t>(m);
  if (i < kStepMarks) return events_[static_cast<size_t>(i)];
  JTOK_CHECK(layer >= 0 && layer < layers_, "DecodeProfiler: layer ", layer, " of ", layers_);
  return events_[static_cast<size_t>(kStepMarks + kLayerMarks * layer + (i - kStepMarks))];
}

void DecodeProfiler::begin_step() {
  waited_.assign(waited_.size(), 0);
  issue_ms_ = 0;
}

void DecodeProfiler::mark(StepMark m, int64_t layer, cudaStream_t stream) {
  JTOK_CUDA_CHECK(cudaEventRecord(event(m, layer), stream));
  if (m == StepMark::wait_begin) waited_[static_cast<size_t>(layer)] = 1;
}

float DecodeProfiler::ms(StepMark a, int64_t la, StepMark b, int64_t lb) const {
  float t = 0;
  JTOK_CUDA_CHECK(cudaEventElapsedTime(&t, event(a, la), event(b, lb)));
  return t;
}

// Each layer from its begin to the next layer's (the head's after the last): attention to
// attention_end, the rest its MLP half, less the wait for its rows.
StepBreakdown DecodeProfiler::read() const {
  JTOK_CUDA_CHECK(cudaEventSynchronize(event(StepMark::copy_end, 0)));
  StepBreakdown b;
  b.valid = true;
  b.step_ms = ms(StepMark::step_begin, 0, StepMark::copy_end, 0);
  b.embed_ms = ms(StepMark::step_begin, 0, StepMark::layer_begin, 0);
  for (int64_t l = 0; l < layers_; ++l) {
    b.attention_ms += ms(StepMark::layer_begin, l, StepMark::attention_end, l);
    const double half = l + 1 < layers_ ? ms(StepMark::attention_end, l, StepMark::layer_begin, l + 1)
                                        : ms(StepMark::attention_end, l, StepMark::head_begin, 0);
    const double wait = waited_[static_cast<size_t>(l)] ? ms(StepMark::wait_begin, l, StepMark::wait_end, l) : 0.0;
    b.rows_wait_ms += wait;
    b.mlp_ms += half - wait;
  }
  b.head_ms = ms(StepMark::head_begin, 0, StepMark::head_end, 0);
  b.digest_ms = ms(StepMark::head_end, 0, StepMark::digest_end, 0);
  b.logits_copy_ms = ms(StepMark::digest_end, 0, StepMark::copy_end, 0);
  b.rows_issue_ms = issue_ms_;
  return b;
}

}  // namespace jtok::cuda
