// The writable, training layout of the token-major table store (docs/formats.md "Training table
// store"): for each token id, every table's row together with its AdamW moments and the optimizer
// step the row has had, so a trainer can keep tables larger than memory on disk. A directory of:
//   tables.bin    units of 4 KiB (or, for a block larger than a page, whole pages): a unit holds
//                 per_page token blocks (token t in unit t / per_page at (t % per_page) *
//                 block_bytes) and ends with the FNV-1a 64 of its other bytes, so a torn or altered
//                 unit is caught when it is read. A block holds, per table in the manifest's order,
//                 value (dim f32), exp_avg (dim f32), exp_avg_sq (dim f32), row_step (int32).
//   manifest.json format, ids, the geometry, per table its name, dim and offset in the block.
//   undo.log      the undo log: a 32-byte header (magic, base step, target step, FNV-1a 64 of the
//                 rest), then one record per unit overwritten since the base step: its byte offset,
//                 the FNV-1a 64 of offset and bytes, and the unit's bytes as they were at the base.
// Units are cached in DRAM (CLOCK, dirty bits) and written back on eviction; before a unit is first
// overwritten after the base step its old bytes are appended to the log and the log fsynced. A
// checkpoint at step N: flush(N) writes back every dirty unit, fsyncs tables.bin and records N as
// the log's target; the trainer then writes its checkpoint; seal(N) replaces the log by an empty
// one based at N. Opening for step S: a log based at S is rolled back (its records written back:
// the store returns to step S); a log whose target is S (the crash came after the flush) is
// dropped; anything else is refused. So a kill at any moment resumes from the last checkpoint.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/token_table.h"

namespace jtok {

struct TrainStoreTable {
  std::string name;
  int64_t dim = 0;
  int64_t offset = 0;  // bytes into the token's block: value, exp_avg, exp_avg_sq, row_step
};

class TrainTableStore {
 public:
  // Writes f32 tables (whole tables of the same ids, any in-memory storage) as a training store at
  // dir with zero moments and every row at `step`; a temp directory, fsynced, renamed; dir must not
  // exist.
  static void create(const std::string& dir, const std::vector<TokenTable>& tables, const std::vector<std::string>& names,
                     int64_t step);
  // Opens dir for training resumed at checkpoint step `step`, rolling back what the undo log holds
  // (see above); a bad manifest, a data file of the wrong size, a torn log header or a log of
  // another step is refused naming the file. cache_bytes: the DRAM cache (at least two units).
  static std::shared_ptr<TrainTableStore> open(const std::string& dir, int64_t cache_bytes, int64_t step);
  ~TrainTableStore();  // closes; never writes back (a crash and a clean exit after seal look alike)
  TrainTableStore(const TrainTableStore&) = delete;
  TrainTableStore& operator=(const TrainTableStore&) = delete;

  const std::vector<TrainStoreTable>& tables() const { return tables_; }
  int64_t ids() const { return ids_; }
  const std::string& dir() const { return dir_; }

  // Row access, thread-safe, called from parallel loops: they never throw. A failure (a read or
  // write error, a full disk, a unit whose checksum fails) is kept, later calls do nothing (reads
  // give zeros, loads false) and check() throws it naming the file.
  void read_value(int64_t k, int64_t id, float* out);  // out (dim)
  // The row of table k for id with its moments and step: p, m, v (dim) and *step; false (and
  // nothing read) after an error.
  bool load_row(int64_t k, int64_t id, float* p, float* m, float* v, int32_t* step);
  void store_row(int64_t k, int64_t id, const float* p, const float* m, const float* v, int32_t step);
  void check() const;

  // The checkpoint protocol (not thread-safe; between steps): flush before the trainer's checkpoint
  // of step `step` is complete, seal after. Both throw on failure (the store then still rolls back
  // to the previous checkpoint when reopened).
  void flush(int64_t step);
  void seal(int64_t step);

  struct Stats { int64_t hits = 0, misses = 0, bytes_read = 0, bytes_written = 0, units_logged = 0; };
  Stats stats() const;

 private:
  TrainTableStore() = default;
  void roll_back_or_drop_log(int64_t step);       // at open (throws)
  uint8_t* unit(int64_t u);                       // the cached unit (lock held; throws)
  void write_back(const std::vector<int64_t>& slots);  // dirty slots to the file, logged first (throws)
  uint8_t* row_bytes(int64_t k, int64_t id, bool dirty);  // lock held; null after an error
  void keep_error(const std::exception& e);
  std::string dir_, data_path_, log_path_;
  int fd_ = -1, log_fd_ = -1;
  int64_t ids_ = 0, block_bytes_ = 0, per_page_ = 1, unit_bytes_ = 0, units_ = 0, log_end_ = 0;
  int64_t base_step_ = 0;
  std::vector<TrainStoreTable> tables_;
  mutable std::mutex mu_;
  std::vector<uint8_t> slots_;      // (n_slots, unit_bytes)
  std::vector<int64_t> slot_unit_;  // unit in each slot, or -1
  std::vector<uint8_t> referenced_, dirty_;
  std::vector<int32_t> unit_slot_;  // (units) slot of each unit, or -1
  std::vector<uint8_t> logged_;     // (units) old bytes in the log since the base step
  int64_t hand_ = 0;
  int64_t kill_at_write_ = -1;      // test hook JTOK_TEST_STORE_KILL_AT_WRITE (see the .cpp)
  Stats stats_;
  std::string error_;
};

}  // namespace jtok
