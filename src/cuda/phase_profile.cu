// A GPU training step's phase times (src/cuda/phase_profile.h).
#include "cuda/phase_profile.h"

#include "cuda/check.h"

namespace jtok::cuda {

namespace {
// Two timing events, destroyed however the measurement ends.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    JTOK_CUDA_CHECK(cudaEventCreate(&start));
    JTOK_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};
}  // namespace

double best_event_ms(cudaStream_t stream, const std::function<void()>& f, int reps) {
  EventPair e;
  f();
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    JTOK_CUDA_CHECK(cudaEventRecord(e.start, stream));
    f();
    JTOK_CUDA_CHECK(cudaEventRecord(e.stop, stream));
    JTOK_CUDA_CHECK(cudaEventSynchronize(e.stop));
    float ms = 0;
    JTOK_CUDA_CHECK(cudaEventElapsedTime(&ms, e.start, e.stop));
    if (r == 0 || ms < best) best = ms;
  }
  return best;
}

PhaseProfile::~PhaseProfile() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void PhaseProfile::record(const char* phase, cudaStream_t stream) {
  const size_t i = phases_.size();
  if (i == events_.size()) {
    cudaEvent_t e = nullptr;
    JTOK_CUDA_CHECK(cudaEventCreate(&e));  // a timing event
    events_.push_back(e);
  }
  JTOK_CUDA_CHECK(cudaEventRecord(events_[i], stream));
  phases_.push_back(phase);
}

void PhaseProfile::end_step() {
  for (size_t i = 1; i < phases_.size(); ++i) {
    if (!phases_[i]) continue;  // a begin: the gap before it is no phase's
    float ms = 0;
    JTOK_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
    size_t k = 0;
    while (k < total_ms_.size() && total_ms_[k].first != phases_[i]) ++k;
    if (k == total_ms_.size()) total_ms_.emplace_back(phases_[i], 0.0);
    total_ms_[k].second += ms;
  }
  phases_.clear();
  ++steps_;
}

std::vector<std::pair<std::string, double>> PhaseProfile::mean_ms() const {
  std::vector<std::pair<std::string, double>> r = total_ms_;
  for (auto& [phase, ms] : r) ms /= steps_ > 0 ? static_cast<double>(steps_) : 1.0;
  return r;
}

}  // namespace jtok::cuda
