// Token-table row prefetch for inference with memory-mapped tables (paper 3.5.2): the rows a step
// will read are known from its token ids before the backbone runs (JTok's row of each token in
// every JTok layer; JTok-M's router has not chosen yet, so all n_e candidate rows of the id), so a
// helper thread can bring their pages in while the compute thread runs the first layers.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "store/table_store.h"
#include "model/transformer.h"

namespace jtok {

struct TableRow {
  int32_t table;  // index into Model::tables
  int32_t row;    // token id
  bool operator==(const TableRow&) const = default;
};

// The (table, row) pairs a forward over ids[0..n) may read: for every distinct id (ascending), each
// JTok layer's table, and each JTok-M layer's n_e tables; each pair once, by table then id. Ids are
// checked against the vocabulary.
std::vector<TableRow> table_rows_needed(const Model& m, const int32_t* ids, int64_t n);

struct PrefetchStats {
  int64_t jobs = 0, rows = 0;   // steps announced, (table, row) pairs prefetched
  int64_t pages = 0;            // pages touched (a row's pages, an int8 row's scale page)
  int64_t major_faults = 0;     // major page faults taken by the helper thread (reads off the compute thread)
  int64_t dropped = 0;          // jobs dropped unstarted because newer ones queued behind them
};

// A helper thread: submit(rows) returns at once; the thread asks the kernel for the rows' pages
// (madvise WILLNEED, all at once) and then touches each page (one read per page), so the page
// faults happen on it, overlapped with the caller's compute, not in the gathers. Rows of RAM tables
// are skipped (nothing to fetch). Jobs run in order; when the thread falls behind (a cold disk),
// at most kMaxQueued wait and the oldest is dropped: its step has most likely run already. The
// destructor finishes the queued ones.
class RowPrefetcher {
 public:
  explicit RowPrefetcher(const Model& m);
  ~RowPrefetcher();
  RowPrefetcher(const RowPrefetcher&) = delete;
  RowPrefetcher& operator=(const RowPrefetcher&) = delete;
  // True when some table is a view (a mapped file): otherwise there is nothing to prefetch.
  bool useful() const { return useful_; }
  static constexpr size_t kMaxQueued = 4;
  void submit(std::vector<TableRow> rows);
  // Waits until every submitted job is done (tests, benchmarks).
  void drain();
  PrefetchStats stats() const;

 private:
  void loop();
  const Model& m_;
  bool useful_ = false;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<std::vector<TableRow>> jobs_;
  bool busy_ = false, stop_ = false;
  PrefetchStats stats_;
  std::thread thread_;
};

// Touches rows (table, row) of m's view tables on the calling thread (madvise WILLNEED, then one
// read per page); returns the pages touched. What RowPrefetcher's thread runs.
int64_t touch_rows(const Model& m, const std::vector<TableRow>& rows);

// Disk tables (--tables disk): a token's rows of every table are one block of the store, so the
// read-ahead is by id. Hands ids[0..n) to the store of m's disk tables (prefetch_rows: its I/O
// threads read the blocks not cached while the caller goes on); nothing for RAM or mapped tables.
// Called the moment ids are known: a prompt at admission, a token right after it is sampled.
// Returns the blocks queued.
int64_t prefetch_disk_rows(const Model& m, const int32_t* ids, int64_t n);
// The counters of the stores of m's disk tables (TableStore::Stats, summed), or none when no table is on disk.
std::optional<TableStore::Stats> disk_table_stats(const Model& m);

}  // namespace jtok
