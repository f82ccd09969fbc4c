// The writable, training layout of the token-major table store (docs/formats.md "Training table
// store"): for each token id, every table's row together with its AdamW moments and the optimizer
// step the row has had, so a trainer can keep tables larger than memory on disk. A directory of:
//   tables.bin    units of 4 KiB (or, for a block larger than a page, whole pages): a unit holds
//                 per_page token blocks (token t in unit t / per_page at (t % per_page) *
//                 block_bytes) and ends with the sum64 (core/checksum.h) of its other bytes, so a torn or altered
//                 unit is caught when it is read. A block holds, per table in the manifest's order,
//                 its row: value, exp_avg, exp_avg_sq (dim f32 each), row_step (int32), as
//                 TrainRowLayout (store/train_block.h) defines it.
//   manifest.json format, ids, the geometry, per table its name, dim and offset in the block.
//   undo.log      the undo log: a 32-byte header (magic, base step, target step, FNV-1a 64 of the
//                 rest), then one record per unit overwritten since the base step: its byte offset,
//                 the sum64 of offset and bytes, and the unit's bytes as they were at the base.
// Units are cached in DRAM (CLOCK, dirty bits) and written back on eviction; before a unit is first
// overwritten after the base step its old bytes are appended to the log and the log fsynced. A
// checkpoint at step N: flush(N) writes back every dirty unit, fsyncs tables.bin and records N as
// the log's target; the trainer then writes its checkpoint; seal(N) replaces the log by an empty
// one based at N. Opening for step S: a log based at S is rolled back (its records written back:
// the store returns to step S); a log whose target is S (the crash came after the flush) is
// dropped; anything else is refused. So a kill at any moment resumes from the last checkpoint.
//
// Read-ahead (the trainer knows the next batch's ids a step early): prefetch() queues units for a
// pool of I/O threads (store/read_pool.h, the read-only store's), which read them into slots
// while the current step computes. Who owns what: mu_ guards the cache's maps, bits and counters
// and is never held during I/O; a slot being read (reading_) belongs to its reader until it is
// marked ready; an evicted dirty unit's bytes are copied out under mu_ (the slot is free at once)
// and written by write_pending(), one writer at a time (write_mu_, which also guards the log, its
// offset and logged_), so log records stay in order and each is fsynced before its unit is
// written; a unit whose copy is not yet on file is read by nobody until it is (writing_). The
// units marked for the current step or the next (begin_step, prefetch) are never chosen by the
// read-ahead, and by a miss only when every other slot is taken.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "store/table_io.h"
#include "store/train_block.h"
#include "store/clock_slots.h"
#include "store/read_pool.h"
#include "store/disk_rows.h"

namespace jtok {

struct TrainStoreTable {
  std::string name;
  int64_t dim = 0;
  int64_t offset = 0;  // bytes into the token's block, where its row (TrainRowLayout) starts
  TrainRowLayout layout() const { return {dim}; }
};

class TrainTableStore {
 public:
  // Writes a training store at dir of `ids` rows of the tables with zero moments and every row at
  // `step`; a temp directory, fsynced, renamed; dir must not exist. From a row source, for tables
  // that never exist whole (a fresh run's random init, or a model's tables: train/disk_tables.h):
  // row(id, k, values) writes table k's row of id (its dim floats), called in token order (id
  // ascending, then k), one unit held at a time. tables: names and dims (offsets are computed).
  using RowSource = std::function<void(int64_t id, int64_t k, float* values)>;
  static void create(const std::string& dir, const std::vector<TrainStoreTable>& tables, int64_t ids, int64_t step,
                     const RowSource& row);
  // Opens dir for training resumed at checkpoint step `step`, rolling back what the undo log holds
  // (see above); a bad manifest, a data file of the wrong size, a torn log header or a log of
  // another step is refused naming the file. cache_bytes: the DRAM cache (at least two units);
  // io_threads: the read-ahead's I/O threads; io (store/table_io.h): direct (or automatic where the
  // file system takes it) reads units with O_DIRECT (past the page cache, into page-aligned slots;
  // writes stay buffered, and Linux writes a range's dirty pages back before a direct read of it);
  // with direct, a file system without O_DIRECT is refused naming the file.
  static std::shared_ptr<TrainTableStore> open(const std::string& dir, int64_t cache_bytes, int64_t step,
                                               int io_threads = 4, TableIo io = TableIo::pread);
  ~TrainTableStore();  // closes; never writes back (a crash and a clean exit after seal look alike)
  TrainTableStore(const TrainTableStore&) = delete;
  TrainTableStore& operator=(const TrainTableStore&) = delete;

  const std::vector<TrainStoreTable>& tables() const { return tables_; }
  int64_t ids() const { return ids_; }
  const std::string& dir() const { return dir_; }
  bool direct_io() const { return direct_fd_ >= 0; }  // units read with O_DIRECT (open's io resolved)

  // Row access, thread-safe, called from parallel loops: they never throw. A failure (a read or
  // write error, a full disk, a unit whose checksum fails) is kept, later calls do nothing (reads
  // give zeros, loads false) and check() throws it naming the file.
  void read_value(int64_t k, int64_t id, float* out);  // out (dim)
  // The row of table k for id with its moments and step: p, m, v (dim) and *step; false (and
  // nothing read) after an error.
  bool load_row(int64_t k, int64_t id, float* p, float* m, float* v, int32_t* step);
  void store_row(int64_t k, int64_t id, const float* p, const float* m, const float* v, int32_t step);
  void check() const;

  // Read-ahead. begin_step(g): step g's batches are the ones being computed now (g counts up from
  // 0). prefetch(ids, n, g): the units of ids (each in [0, ids()), else it fails naming the id) are
  // marked as needed by step g (the current one or the next) and those not cached are queued for
  // the I/O threads, which read each into a slot whose unit no step from the current one on needs
  // (a dirty one's bytes written back by that thread), or skip it when there is none (the gather
  // then reads it). Returns the units queued; thread-safe. drain_prefetch() waits for them.
  void begin_step(int64_t g);
  int64_t prefetch(const int32_t* ids, int64_t n, int64_t g);
  void drain_prefetch();

  // The checkpoint protocol (not thread-safe; between steps): flush before the trainer's checkpoint
  // of step `step` is complete, seal after. Both throw on failure (the store then still rolls back
  // to the previous checkpoint when reopened).
  void flush(int64_t step);
  void seal(int64_t step);

  // Row lookups: rows_read (read_value, load_row) and rows_written (store_row); each found its unit
  // cached (hits), being read or written and waited (waits), or read it itself (misses). Units:
  // units_read (every pread of a unit into the cache: the misses' and the I/O threads'), read_ahead
  // (the I/O threads' of them), units_written (to tables.bin), units_logged (old bytes to the log);
  // bytes_read also counts the log's reads of old bytes. prefetch_queued / prefetch_skipped: units
  // handed to the I/O threads, and those they found no free slot for.
  struct Stats {
    int64_t hits = 0, misses = 0, waits = 0, bytes_read = 0, bytes_written = 0, units_logged = 0;
    int64_t rows_read = 0, rows_written = 0, units_read = 0, units_written = 0, read_ahead = 0;
    int64_t prefetch_queued = 0, prefetch_skipped = 0;
  };
  Stats stats() const;

 private:
  struct Copy {  // an evicted dirty unit's bytes, on their way to the file
    int64_t unit = 0;
    std::vector<uint8_t> bytes;
  };
  TrainTableStore() = default;
  void roll_back_or_drop_log(int64_t step);  // at open (throws)
  // The cached unit u (lock held on entry and return, released while it reads; throws); null after
  // an error.
  uint8_t* unit(int64_t u, std::unique_lock<std::mutex>& lock);
  // CLOCK: a ready slot, unreferenced, whose unit no step from keep_from on needs; -1 if none (lock held).
  int64_t claim_slot(int64_t keep_from);
  // Empties slot s for reuse, a dirty unit's bytes copied to pending_ (lock held); true if copied.
  bool evict(int64_t s);
  void copy_out(size_t sl);  // slot sl's dirty unit to pending_, the slot clean (lock held)
  // Reads unit u into slot s and checks its checksum (no lock held): "" or what went wrong.
  std::string read_unit(int64_t u, int64_t s);
  void read_ahead_one(int64_t u);  // an I/O thread's job
  // Writes the pending copies, logged first (takes write_mu_, then mu_ briefly); an error is kept.
  void write_pending();
  void write_units(const std::vector<Copy>& batch, Stats& st);  // write_mu_ held (throws)
  uint8_t* row_bytes(int64_t k, int64_t id, bool dirty, std::unique_lock<std::mutex>& lock);  // null after an error
  void keep_error(const std::string& what);  // lock held
  std::string dir_, data_path_, log_path_;
  int fd_ = -1, log_fd_ = -1, direct_fd_ = -1;  // direct_fd_: O_DIRECT reads (direct_io), else -1
  int64_t ids_ = 0, block_bytes_ = 0, per_page_ = 1, unit_bytes_ = 0, units_ = 0;
  std::vector<TrainStoreTable> tables_;
  // The cache (mu_).
  mutable std::mutex mu_;
  std::condition_variable done_;    // a read or a write finished, or an error
  std::vector<uint8_t> slots_;      // (n_slots, unit_bytes) from slots_base_, 4 KiB aligned
  uint8_t* slots_base_ = nullptr;
  uint8_t* slot_data(int64_t s) const { return slots_base_ + s * unit_bytes_; }
  ClockSlots index_;                // the unit each slot holds (CLOCK, store/clock_slots.h)
  std::vector<uint8_t> dirty_, reading_;
  std::vector<int64_t> need_;       // (units) the last step that marked the unit (prefetch), or -1
  std::vector<int32_t> writing_;    // (units) copies of the unit in pending_ or being written
  std::vector<Copy> pending_;
  int64_t cur_ = 0;
  Stats stats_;
  std::string error_;
  // The writer's (write_mu_).
  std::mutex write_mu_;
  std::vector<uint8_t> logged_;     // (units) old bytes in the log since the base step
  int64_t log_end_ = 0, base_step_ = 0;
  int64_t kill_at_write_ = -1;      // test hook JTOK_TEST_STORE_KILL_AT_WRITE (see the .cpp)
  std::unique_ptr<ReadPool> pool_;  // last: its threads stop first
};

// Table k of the store as the model reads it (TokenTable::on_disk: its values), and every table in
// the manifest's order (store/disk_rows.cpp).
std::shared_ptr<const DiskRows> disk_rows(std::shared_ptr<TrainTableStore> store, int64_t k);
std::vector<std::shared_ptr<const DiskRows>> disk_rows(const std::shared_ptr<TrainTableStore>& store);
// The training store whose table `rows` is, and its index there, for the table optimizer's
// load_row / store_row ({null, -1}: not a training store's rows).
struct TrainStoreTableRef {
  TrainTableStore* store = nullptr;
  int64_t table = -1;
};
TrainStoreTableRef train_store_of(const DiskRows* rows);

// The format, for a reader that does not train with the store (store/train_store_snapshot.h): the
// manifest checked as open() checks it, a unit's checksum, the undo log's header (a torn header or
// a bad magic refused naming the file) and its whole records in order (a torn last record ends
// them): each(the unit's byte offset in tables.bin, where its old bytes start in the log, the bytes).
struct TrainStoreLayout {
  std::string manifest, data_path, log_path;
  int64_t ids = 0, block_bytes = 0, per_page = 1, unit_bytes = 0, units = 0;
  std::vector<TrainStoreTable> tables;
};
TrainStoreLayout read_train_store_layout(const std::string& dir);
bool train_store_unit_ok(const uint8_t* unit, int64_t unit_bytes);
struct UndoLogHeader {
  int64_t base = 0, target = -1;  // target -1: no flush recorded since the base
};
UndoLogHeader read_undo_log_header(const std::string& path);
void for_each_undo_record(const std::string& path, int64_t unit_bytes, int64_t units,
                          const std::function<void(int64_t unit_offset, int64_t log_offset, const uint8_t* bytes)>& each);

}  // namespace jtok
