// A rank that hangs must not hang the job. MPI collectives wait forever for a rank that
// is stopped or stuck, and mpirun only notices ranks that exit. So each rank of a multi-rank run has
// a watchdog thread (no MPI calls: the main thread alone talks MPI) that
//   - writes a heartbeat file DIR/.ranks/rank_R once a second: its step and whether it is blocked
//     in an MPI call and since when (dist::current_call);
//   - when this rank has been blocked in one MPI call for longer than the timeout, reads the other
//     ranks' heartbeats, names the ranks that stopped beating (stopped, dead or wedged) or that
//     are busy outside MPI, prints "jtok: error: rank R of P: ..." and exits non-zero, so mpirun
//     ends the whole job within about the timeout.
// DIR must be shared by the ranks (the run directory is: checkpoints are read by every rank).
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace jtok::dist {

class Watchdog {
 public:
  // Does nothing in a world of one or with timeout_s <= 0.
  Watchdog(const std::string& dir, double timeout_s);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  void set_step(int64_t step) { step_.store(step); }

 private:
  void run();
  std::string dir_;
  double timeout_s_ = 0;
  std::atomic<int64_t> step_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace jtok::dist
