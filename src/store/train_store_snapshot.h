// A training table store (store/train_table_store.h) read as it was at a checkpoint's step, without
// writing to it: what an export of a disk-trained checkpoint's tables reads (train/store_export.h).
// The store must be at that step: its undo log based there (a unit overwritten since is read from
// the log, which holds its bytes as they were at the step; the others from tables.bin), or the
// flush of that step recorded in the log (tables.bin is the step's). A store at another step is
// refused naming both steps: its tables of that checkpoint are gone.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "store/train_table_store.h"

namespace jtok {

class TrainStoreSnapshot {
 public:
  // checkpoint: named in the refusal of a store at another step.
  static std::unique_ptr<TrainStoreSnapshot> open(const std::string& dir, int64_t step, const std::string& checkpoint);
  ~TrainStoreSnapshot();
  TrainStoreSnapshot(const TrainStoreSnapshot&) = delete;
  TrainStoreSnapshot& operator=(const TrainStoreSnapshot&) = delete;

  const TrainStoreLayout& layout() const { return l_; }
  // Unit u's bytes at the step into buf (unit_bytes), its checksum checked (a torn or altered unit
  // is refused naming the file and the unit).
  void read_unit(int64_t u, uint8_t* buf) const;
  // Units read from the undo log instead of tables.bin (those overwritten since the step).
  int64_t units_from_log() const { return from_log_count_; }
  // Fails, naming the log, when the store changed since open (a trainer wrote to it meanwhile: what
  // was read may not be the step's).
  void check_unchanged() const;

 private:
  TrainStoreSnapshot() = default;
  TrainStoreLayout l_;
  int fd_ = -1, log_fd_ = -1;
  std::vector<int64_t> from_log_;  // (units) where the unit's bytes at the step start in the log, or -1
  int64_t from_log_count_ = 0, log_size_ = 0;
  UndoLogHeader header_;
};

}  // namespace jtok
