// A GPU training step's phases timed by cudaEvents (`JTOK_PROFILE=1 jtok bench-train --device
// cuda`): the model's forward, backward and optimizer record a mark on their stream where a phase
// ends (cuda/model.h's DeviceModel::profile, set while profiling), the time since the mark before it
// charged to that phase; the trainer adds a step's times up after the step's sync. Phases that
// recur (a layer's attention, each micro-batch) sum within a step. Host code; includable from g++.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace jtok::cuda {

// The best milliseconds of reps calls of f (each queuing its work on stream), after one warm-up call,
// by two cudaEvents around each call (waits for the stream after each).
double best_event_ms(cudaStream_t stream, const std::function<void()>& f, int reps);

class PhaseProfile {
 public:
  PhaseProfile() = default;
  ~PhaseProfile();
  PhaseProfile(const PhaseProfile&) = delete;
  PhaseProfile& operator=(const PhaseProfile&) = delete;

  // A starting point on stream: the next mark's time runs from here (nothing is charged).
  void begin(cudaStream_t stream) { record(nullptr, stream); }
  // The time since the last mark or begin is `phase`'s (a string literal: its pointer is kept).
  void mark(const char* phase, cudaStream_t stream) { record(phase, stream); }
  // After the step's work is done (its stream synchronized): its phases' times added to the totals.
  void end_step();
  // Per phase in order of first appearance: milliseconds per step, over the steps ended so far.
  std::vector<std::pair<std::string, double>> mean_ms() const;
  int64_t steps() const { return steps_; }

 private:
  void record(const char* phase, cudaStream_t stream);

  std::vector<cudaEvent_t> events_;  // a pool, reused every step
  std::vector<const char*> phases_;  // this step's marks: the phase each ends (null: a begin)
  std::vector<std::pair<std::string, double>> total_ms_;
  int64_t steps_ = 0;
};

// The mark when a profile is set (profile: null when not profiling).
inline void mark_phase(PhaseProfile* profile, const char* phase, cudaStream_t stream) {
  if (profile) profile->mark(phase, stream);
}

}  // namespace jtok::cuda
