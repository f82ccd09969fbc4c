// The token-major table store on disk (docs/formats.md "Table store"): for each token id, the rows
// of every table of every layer stored together in one block, so that one token costs one read,
// not one per table. A directory of two files:
//   tables.bin     token t's block at (t / per_page) * 4096 + (t % per_page) * block_bytes when a
//                  block fits a 4 KiB page (per_page blocks a page, none straddling two), else at
//                  t * stride (stride = block_bytes rounded up to 4 KiB); the block holds each
//                  table's row in the manifest's order (dim elements of its dtype, then an int8
//                  row's float scale), each part 4-byte aligned.
//   manifest.json  format, ids, the block geometry, per table its name, dim, dtype and offset in
//                  the block, and the data file's size and FNV-1a 64 checksum.
// A table of the store is a TokenTable like any other (TokenTable::on_disk): read through the one
// gather, its token blocks held in a bounded DRAM cache (CLOCK) filled by pread.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/token_table.h"

namespace jtok {

struct TableStoreTable {
  std::string name;
  int64_t dim = 0;
  Dtype dtype = Dtype::f32;
  int64_t offset = 0;  // bytes into the token's block
};

// Writes tables (all of the same rows, any dtype or storage) as a store at dir: a temp directory,
// every file fsynced, renamed to dir; dir must not exist.
void write_table_store(const std::string& dir, const std::vector<TokenTable>& tables, const std::vector<std::string>& names);

class TableStore {
 public:
  // Opens dir, checking the manifest, the data file's size and its checksum (a torn, truncated or
  // altered store is refused naming the file). cache_bytes: the DRAM row cache's budget (at least
  // one page of blocks).
  static std::shared_ptr<TableStore> open(const std::string& dir, int64_t cache_bytes);
  ~TableStore();
  TableStore(const TableStore&) = delete;
  TableStore& operator=(const TableStore&) = delete;

  const std::vector<TableStoreTable>& tables() const { return tables_; }
  int64_t ids() const { return ids_; }
  // The raw row of table k for `id` (dim elements of its dtype) and its int8 scale, copied to raw /
  // *scale from the cached block (read from the file on a miss). Thread-safe.
  void read_raw(int64_t k, int64_t id, void* raw, float* scale) const;
  struct Stats { int64_t hits = 0, misses = 0, bytes_read = 0; };
  Stats stats() const;
  const std::string& dir() const { return dir_; }

 private:
  TableStore() = default;
  int64_t block_offset(int64_t id) const;
  const uint8_t* block(int64_t id) const;  // the cached block (lock held)
  std::string dir_, data_path_;
  int fd_ = -1;
  int64_t ids_ = 0, block_bytes_ = 0, per_page_ = 1, stride_ = 0;
  std::vector<TableStoreTable> tables_;
  // The CLOCK cache of token blocks.
  mutable std::mutex mu_;
  mutable std::vector<uint8_t> slots_;      // (n_slots, block_bytes)
  mutable std::vector<int64_t> slot_id_;    // id in each slot, or -1
  mutable std::vector<uint8_t> referenced_;
  mutable std::vector<int32_t> id_slot_;    // (ids) slot of each id, or -1
  mutable int64_t hand_ = 0;
  mutable Stats stats_;
};

}  // namespace jtok
