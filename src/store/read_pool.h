// The I/O threads of the disk table store's read-ahead (store/table_store.h, TableStore::prefetch):
// a small pool that runs one job per item (a token id whose block the store has already reserved
// in its cache) on whichever thread is free. The store does the reserving and the reading; the
// pool only hands items out, so a pread on one thread never waits for another's.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace jtok {

class ReadPool {
 public:
  // threads >= 1 workers, each calling work(item) for the items submitted, in submission order
  // (the first free thread takes the oldest item). work must not throw (the store records a failed
  // read and lets the gather read the block itself, which reports the error).
  ReadPool(int threads, std::function<void(int64_t)> work);
  ~ReadPool();  // drops the items not started, waits for those under way
  ReadPool(const ReadPool&) = delete;
  ReadPool& operator=(const ReadPool&) = delete;
  void submit(const std::vector<int64_t>& items);
  // Waits until every submitted item has been run (tests, benchmarks).
  void drain();
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void loop();
  std::function<void(int64_t)> work_;
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<int64_t> items_;
  int64_t busy_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace jtok
