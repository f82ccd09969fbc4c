// A run directory (`jtok train --out DIR`: log.jsonl, checkpoints/) belongs to one run. A fresh run
// never writes into a directory that holds another run's checkpoints or log (it would mix the two
// and its retention would delete the other's checkpoints): it refuses unless told --resume (continue
// that run) or --overwrite (delete that run's checkpoints and log, said aloud). Each run carries an
// id, saved in every checkpoint's trainer_state.json, so that retention deletes only its own.
#pragma once
#include <string>

namespace jtok {

// Without resume: fails if dir holds checkpoints or a log (naming dir and its newest step), unless
// overwrite, which removes them and prints what it removed. Creates dir.
void claim_run_dir(const std::string& dir, bool resume, bool overwrite);

// A fresh run's id: time, pid and random bits, in hex.
std::string new_run_id();

// An exclusive lock on DIR/.lock for the process's lifetime (flock): a second trainer on the same
// directory fails naming it instead of interleaving checkpoints.
class RunDirLock {
 public:
  explicit RunDirLock(const std::string& dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace jtok
