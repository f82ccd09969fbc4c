// The token-major table store on disk (docs/formats.md "Table store"): for each token id, the rows
// of every table of every layer stored together in one block, so that one token costs one read,
// not one per table. A directory of two files:
//   tables.bin     token t's block at (t / per_page) * 4096 + (t % per_page) * block_bytes when
//                  two or more blocks fit a 4 KiB page (per_page blocks a page, none straddling
//                  two), else at t * stride (stride = block_bytes rounded up to 4 KiB); the block holds each
//                  table's row in the manifest's order (dim elements of its dtype, int4 two a
//                  byte in (dim + 1) / 2 bytes, then an int8 / int4 row's float scale), each
//                  part starting 4-byte aligned.
//   manifest.json  format, ids, the block geometry, per table its name, dim, dtype and offset in
//                  the block, the data file's size and FNV-1a 64 checksum, and (optional: older
//                  stores lack it) the source: the checkpoint's directory name and step.
// The model reads a table of the store through DiskRows (store/disk_rows.h, disk_rows() below;
// TokenTable::on_disk): through the one gather, its token blocks held in a bounded DRAM cache
// (CLOCK, store/clock_slots.h, the training store's too) filled by pread. Reads ahead of need
// (prefetch) run on a small pool of I/O threads (store/read_pool.h, the training store's too); no
// thread holds the cache's lock during a pread, and a block being read is read once: a reader that
// needs it waits.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "store/table_io.h"
#include "store/clock_slots.h"
#include "store/read_pool.h"
#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"
#include "store/disk_rows.h"

namespace jtok {

struct TableStoreTable {
  std::string name;
  int64_t dim = 0;
  Dtype dtype = Dtype::f32;
  int64_t offset = 0;  // bytes into the token's block
};

// Where a store's tables came from (the manifest's "source"): the checkpoint directory's name (its
// basename; "" when not recorded), its step, and for a checkpoint trained with --tables disk the
// training store's name and the step its rows were read at (-1 / "": not known or not disk-trained);
// or, with no checkpoint, how a random model's tables were made.
struct TableStoreSource {
  std::string checkpoint;
  int64_t step = -1;
  std::string train_store;
  int64_t train_store_step = -1;
  std::string random;
};
// The basename of a directory path (trailing slashes ignored): what a source records.
std::string dir_basename(const std::string& dir);
// One line for people: "checkpoint ckpt_000004, step 4" (and the training store), a random model's
// tables, or that the manifest does not say (a store written before manifests recorded it).
std::string describe_source(const TableStoreSource& s);

// Writes a store at dir (a temp directory, every file fsynced, renamed to dir; dir must not exist)
// of `ids` rows of the tables, from a row source (a model's tables: train/store_export.h). A table of a store to write, and where its rows come from: row(id, k, raw, scale) puts table k's
// row of `id` in raw (dim elements of its dtype) and an int8 / int4 row's scale in *scale. Called in token
// order (id ascending, then k), one page of blocks held at a time: a source on disk is read
// sequentially and no whole table ever exists (an export of a training store, train/store_export.h).
struct TableStoreSpec {
  std::string name;
  int64_t dim = 0;
  Dtype dtype = Dtype::f32;
};
using StoreRowSource = std::function<void(int64_t id, int64_t k, void* raw, float* scale)>;
void write_table_store(const std::string& dir, int64_t ids, const std::vector<TableStoreSpec>& tables, const StoreRowSource& row,
                       const TableStoreSource& source = {});

// dir's manifest.json parsed (a missing or unparsable manifest refused naming it); *path: its path.
// Both the read-only store and the training store (store/train_table_store.h) open through it.
nlohmann::json read_store_manifest(const std::string& dir, std::string* path);

class TableStore {
 public:
  // Opens dir, checking the manifest, the data file's size and its checksum (a torn, truncated or
  // altered store is refused naming the file). cache_bytes: the DRAM row cache's budget (at least
  // one page of blocks). io_threads: the read-ahead pool's threads (prefetch). io (store/table_io.h):
  // direct (or automatic where the file system takes it) makes every read, the checksum's too, an
  // O_DIRECT read past the page cache: a block's whole aligned page (or a larger block's whole pages)
  // into a page-aligned buffer, then the block copied to its slot; with direct, a file system that
  // refuses O_DIRECT is refused naming the file and the flag (--table-io direct).
  static std::shared_ptr<TableStore> open(const std::string& dir, int64_t cache_bytes, int io_threads = 8,
                                          TableIo io = TableIo::pread);
  ~TableStore();
  TableStore(const TableStore&) = delete;
  TableStore& operator=(const TableStore&) = delete;

  const std::vector<TableStoreTable>& tables() const { return tables_; }
  int64_t ids() const { return ids_; }
  int64_t block_bytes() const { return block_bytes_; }  // one token's block (the bytes of one read)
  // The raw row of table k for `id` (dim elements of its dtype) and its int8 / int4 scale, copied to raw /
  // *scale from the cached block (read from the file on a miss). Thread-safe; never throws (the
  // gathers call it in parallel loops): a failed read (EIO, a short read) gives zeros and is kept
  // for take_error().
  void read_raw(int64_t k, int64_t id, void* raw, float* scale) const;
  // The first failed read since the last call, naming the file, the token, the byte offset and the
  // cause; "" when none. Cleared: the next reads try the file again (check_table_reads).
  std::string take_error() const;
  // Read-ahead: the blocks of ids[0..n) (each in [0, ids()), else it fails naming the id) not cached
  // nor being read are reserved in the cache and queued for the I/O threads; returns at once. A
  // reader that needs a queued block before a thread starts on it reads it itself. At most half the
  // cache is reserved by one call (the rest of the ids are left to the gathers: prefetch_skipped).
  // Returns the blocks queued. Thread-safe.
  int64_t prefetch(const int32_t* ids, int64_t n) const;
  // Waits until every queued read is done (tests, benchmarks).
  void drain_prefetch() const;
  // Lookups (one per table row read): hits found the block cached, waits found it being read and
  // waited for that read, misses read it. Reads: every pread (a miss's or an I/O thread's), with
  // their bytes (read_bytes() each) and summed latency; prefetch_reads are the I/O threads'. hits + waits + misses =
  // rows read.
  struct Stats {
    int64_t hits = 0, misses = 0, bytes_read = 0;
    int64_t waits = 0, reads = 0, read_ns = 0, prefetch_reads = 0;
    int64_t prefetch_queued = 0, prefetch_skipped = 0;
  };
  Stats stats() const;
  const std::string& dir() const { return dir_; }
  const TableStoreSource& source() const { return source_; }
  bool direct_io() const { return direct_; }
  int64_t read_bytes() const { return read_bytes_; }  // the bytes of one read: a block, or its whole pages (direct_io)

 private:
  TableStore() = default;
  int64_t block_offset(int64_t id) const;
  // The cached block of id, read first if need be (lock held on entry and return; released during
  // the read); null when the read failed (kept in error_).
  const uint8_t* block(int64_t id, std::unique_lock<std::mutex>& lock) const;
  // A slot to reuse (CLOCK, store/clock_slots.h, skipping slots being read), its old id unmapped;
  // -1 when every slot is being read (lock held).
  int64_t claim_slot() const;
  // Reads id's block into slot (no lock held); the read's latency goes to *ns. False on an error or
  // a short read, with *why (if given) naming the file, the offset and the cause.
  bool read_block(int64_t id, int64_t slot, int64_t* ns, std::string* why) const;
  // After a read into slot: ready (ok), or freed (failed); wakes the waiters (lock held).
  void finish_read(int64_t id, int64_t slot, bool ok, int64_t ns, bool prefetched) const;
  void prefetch_one(int64_t id) const;  // an I/O thread's job
  // The data file's offset of id's read (its block, or with direct_io the block's first page).
  int64_t read_offset(int64_t id) const;
  void verify_checksum(const nlohmann::json& manifest, int64_t bytes);  // open's whole-file pass
  std::string dir_, data_path_;
  int fd_ = -1;
  bool direct_ = false;
  int64_t ids_ = 0, block_bytes_ = 0, per_page_ = 1, stride_ = 0, read_bytes_ = 0;
  TableStoreSource source_;
  std::vector<TableStoreTable> tables_;
  // The CLOCK cache of token blocks.
  mutable std::mutex mu_;
  mutable std::vector<uint8_t> slots_;      // (n_slots, block_bytes)
  mutable ClockSlots index_;                // the token id each slot holds
  mutable Stats stats_;
  mutable std::string error_;  // the first failed read since take_error()
  // Read state of each slot: ready (or empty), queued for an I/O thread, or being read.
  enum : uint8_t { kReady = 0, kQueued = 1, kReading = 2 };
  mutable std::vector<uint8_t> state_;
  mutable std::condition_variable read_done_;
  std::unique_ptr<ReadPool> pool_;  // after the cache: its threads stop first
};

// Table k of the store as the model reads it (TokenTable::on_disk), and every table in the
// manifest's order (store/disk_rows.cpp).
std::shared_ptr<const DiskRows> disk_rows(std::shared_ptr<const TableStore> store, int64_t k);
std::vector<std::shared_ptr<const DiskRows>> disk_rows(const std::shared_ptr<const TableStore>& store);
// The serving store whose table `rows` is, or null (another store's rows, or none).
const TableStore* table_store_of(const DiskRows* rows);

}  // namespace jtok
