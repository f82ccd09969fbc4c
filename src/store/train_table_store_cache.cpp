// The training table store's DRAM cache of units (store/train_table_store.h): row access, CLOCK
// replacement, the read-ahead's I/O-thread jobs, write-back through the undo log, flush and seal.
// The file side (create, open, roll-back) is in train_table_store.cpp.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <limits>

#include "core/atomic_file.h"
#include "store/train_table_store.h"
#include "store/train_store_io.h"

namespace jtok {

using namespace train_store;

void TrainTableStore::keep_error(const std::string& what) {
  if (error_.empty()) error_ = what;
  done_.notify_all();  // waiters give up
}

int64_t TrainTableStore::claim_slot(int64_t keep_from) {
  return index_.claim([&](int64_t s) {
    const int64_t u = index_.key_of(s);
    return reading_[static_cast<size_t>(s)] || (u >= 0 && need_[static_cast<size_t>(u)] >= keep_from);
  });
}

void TrainTableStore::copy_out(size_t sl) {
  const int64_t u = index_.key_of(static_cast<int64_t>(sl));
  const uint8_t* src = slot_data(static_cast<int64_t>(sl));
  pending_.push_back({u, std::vector<uint8_t>(src, src + unit_bytes_)});
  ++writing_[static_cast<size_t>(u)];
  dirty_[sl] = 0;
}

// A dirty unit takes with it up to kWriteBatch - 1 other dirty units no marked step needs (they stay
// cached, clean): one log fsync for them all, not one a unit.
bool TrainTableStore::evict(int64_t s) {
  constexpr int64_t kWriteBatch = 64;
  const size_t h = static_cast<size_t>(s);
  const int64_t u = index_.key_of(s);
  const bool copied = u >= 0 && dirty_[h];
  if (copied) {
    copy_out(h);
    int64_t n = 1;
    for (size_t sl = 0; sl < dirty_.size() && n < kWriteBatch; ++sl)
      if (dirty_[sl] && !reading_[sl] && need_[static_cast<size_t>(index_.key_of(static_cast<int64_t>(sl)))] < cur_)
        copy_out(sl), ++n;
  }
  index_.unbind(s);
  return copied;
}

std::string TrainTableStore::read_unit(int64_t u, int64_t s) {
  uint8_t* dst = slot_data(s);
  try {
    pread_all(direct_fd_ >= 0 ? direct_fd_ : fd_, dst, unit_bytes_, u * unit_bytes_, data_path_);
  } catch (const std::exception& e) {
    return e.what();
  }
  if (!unit_ok(dst, unit_bytes_))
    return data_path_ + ": unit " + std::to_string(u) + " (bytes " + std::to_string(u * unit_bytes_) + ".." +
           std::to_string((u + 1) * unit_bytes_) + ") fails its checksum (a torn or altered store)";
  return "";
}

// A hit marks the slot referenced. A unit being read is waited for; one whose newest bytes are a
// pending copy is written first (by this thread, if no writer has it). A miss takes a slot no
// marked step needs, else any ready slot, and reads the unit without the lock.
uint8_t* TrainTableStore::unit(int64_t u, std::unique_lock<std::mutex>& lock) {
  bool waited = false;
  for (;;) {
    if (!error_.empty()) return nullptr;
    const int32_t slot = index_.slot_of(u);
    if (slot >= 0 && !reading_[static_cast<size_t>(slot)]) {
      ++(waited ? stats_.waits : stats_.hits);
      index_.touch(slot);
      return slot_data(slot);
    }
    waited = waited || slot >= 0 || writing_[static_cast<size_t>(u)] > 0;
    if (slot >= 0) {
      done_.wait(lock);
      continue;
    }
    if (writing_[static_cast<size_t>(u)] > 0) {
      lock.unlock();
      write_pending();
      lock.lock();
      continue;
    }
    int64_t s = claim_slot(cur_);
    if (s < 0) s = claim_slot(std::numeric_limits<int64_t>::max());
    if (s < 0) {  // every slot is being read
      done_.wait(lock);
      continue;
    }
    const bool copied = evict(s);
    index_.bind(s, u);
    reading_[static_cast<size_t>(s)] = 1;
    lock.unlock();
    const std::string err = read_unit(u, s);
    if (copied) write_pending();
    lock.lock();
    reading_[static_cast<size_t>(s)] = 0;
    done_.notify_all();
    if (!err.empty()) {
      evict(s);  // clean: nothing copied
      fail(err);
    }
    index_.touch(s);
    ++stats_.misses;
    ++stats_.units_read;
    stats_.bytes_read += unit_bytes_;
    return slot_data(s);
  }
}

// An I/O thread's job: unit u read into a slot no step from the current one on needs (none: skip).
// A failed read leaves the slot empty; the gather that needs the unit reads it and reports.
void TrainTableStore::read_ahead_one(int64_t u) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!error_.empty() || index_.slot_of(u) >= 0 || writing_[static_cast<size_t>(u)] > 0) return;
  const int64_t s = claim_slot(cur_);
  if (s < 0) {
    ++stats_.prefetch_skipped;
    return;
  }
  const bool copied = evict(s);
  index_.bind(s, u);
  reading_[static_cast<size_t>(s)] = 1;
  lock.unlock();
  const std::string err = read_unit(u, s);
  lock.lock();
  reading_[static_cast<size_t>(s)] = 0;
  if (err.empty()) {
    index_.touch(s);
    ++stats_.units_read;
    ++stats_.read_ahead;
    stats_.bytes_read += unit_bytes_;
  } else {
    evict(s);
  }
  done_.notify_all();
  lock.unlock();
  if (copied) write_pending();
}

// The copies' units to tables.bin. Each unit not yet in the log since the base step first has its
// old bytes appended there; one fsync of the log, then the units, in the order they were copied.
void TrainTableStore::write_units(const std::vector<Copy>& batch, Stats& st) {
  std::vector<uint8_t> rec(static_cast<size_t>(kRecordHead + unit_bytes_));
  bool appended = false;
  for (const Copy& c : batch) {
    const int64_t off = c.unit * unit_bytes_;
    if (logged_[static_cast<size_t>(c.unit)]) continue;
    pread_all(fd_, rec.data() + kRecordHead, unit_bytes_, off, data_path_);
    st.bytes_read += unit_bytes_;
    std::memcpy(rec.data(), &off, 8);
    const uint64_t rsum = record_sum(rec.data(), rec.data() + kRecordHead, unit_bytes_);
    std::memcpy(rec.data() + 8, &rsum, 8);
    pwrite_all(log_fd_, rec.data(), static_cast<int64_t>(rec.size()), log_end_, log_path_);
    log_end_ += static_cast<int64_t>(rec.size());
    logged_[static_cast<size_t>(c.unit)] = 1;
    ++st.units_logged;
    appended = true;
  }
  if (appended) fsync_or_fail(log_fd_, log_path_);
  std::vector<uint8_t> u(static_cast<size_t>(unit_bytes_));
  for (const Copy& c : batch) {
    std::memcpy(u.data(), c.bytes.data(), u.size());
    seal_unit(u.data(), unit_bytes_);
    const int64_t off = c.unit * unit_bytes_;
    // Test hook JTOK_TEST_STORE_KILL_AT_WRITE=n: SIGKILL in the middle of the n-th unit write-back
    // (half its bytes written): the torn page a crash leaves.
    if (kill_at_write_ > 0 && --kill_at_write_ == 0) {
      pwrite_all(fd_, u.data(), unit_bytes_ / 2, off, data_path_);
      ::fsync(fd_);
      std::raise(SIGKILL);
    }
    pwrite_all(fd_, u.data(), unit_bytes_, off, data_path_);
    st.bytes_written += unit_bytes_;
    ++st.units_written;
  }
}

void TrainTableStore::write_pending() {
  std::lock_guard<std::mutex> writer(write_mu_);
  std::vector<Copy> batch;
  bool failed = false;  // after an error nothing more is written (the store rolls back when reopened)
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(pending_);
    failed = !error_.empty();
  }
  if (batch.empty()) return;
  Stats st;
  std::string err;
  try {
    if (!failed) write_units(batch, st);
  } catch (const std::exception& e) {
    err = e.what();
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const Copy& c : batch) --writing_[static_cast<size_t>(c.unit)];
  stats_.bytes_read += st.bytes_read;
  stats_.bytes_written += st.bytes_written;
  stats_.units_written += st.units_written;
  stats_.units_logged += st.units_logged;
  if (!err.empty()) keep_error(err);
  done_.notify_all();
}

uint8_t* TrainTableStore::row_bytes(int64_t k, int64_t id, bool dirty, std::unique_lock<std::mutex>& lock) {
  if (!error_.empty()) return nullptr;
  try {
    if (id < 0 || id >= ids_) fail("table store ", dir_, ": token id ", id, " outside its ", ids_, " ids");
    uint8_t* u = unit(id / per_page_, lock);
    if (!u) return nullptr;
    if (dirty) dirty_[static_cast<size_t>(index_.slot_of(id / per_page_))] = 1;
    return u + (id % per_page_) * block_bytes_ + tables_[static_cast<size_t>(k)].offset;
  } catch (const std::exception& e) {
    keep_error(e.what());
    return nullptr;
  }
}

void TrainTableStore::read_value(int64_t k, int64_t id, float* out) {
  const TrainRowLayout l = tables_[static_cast<size_t>(k)].layout();
  std::unique_lock<std::mutex> lock(mu_);
  ++stats_.rows_read;
  const uint8_t* b = row_bytes(k, id, false, lock);
  if (b) l.read_value(b, out);
  else std::fill(out, out + l.dim, 0.0f);
}

bool TrainTableStore::load_row(int64_t k, int64_t id, float* p, float* m, float* v, int32_t* step) {
  const TrainRowLayout l = tables_[static_cast<size_t>(k)].layout();
  std::unique_lock<std::mutex> lock(mu_);
  ++stats_.rows_read;
  const uint8_t* b = row_bytes(k, id, false, lock);
  if (!b) return false;
  l.read(b, p, m, v, step);
  return true;
}

void TrainTableStore::store_row(int64_t k, int64_t id, const float* p, const float* m, const float* v, int32_t step) {
  const TrainRowLayout l = tables_[static_cast<size_t>(k)].layout();
  std::unique_lock<std::mutex> lock(mu_);
  ++stats_.rows_written;
  uint8_t* b = row_bytes(k, id, true, lock);
  if (!b) return;
  l.write(b, p, m, v, step);
}

void TrainTableStore::begin_step(int64_t g) {
  std::lock_guard<std::mutex> lock(mu_);
  cur_ = g;
}

int64_t TrainTableStore::prefetch(const int32_t* ids, int64_t n, int64_t g) {
  std::vector<int64_t> units(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= ids_) fail("table store ", dir_, ": prefetch of token id ", ids[i], " outside [0, ", ids_, ")");
    units[static_cast<size_t>(i)] = ids[i] / per_page_;
  }
  std::sort(units.begin(), units.end());
  units.erase(std::unique(units.begin(), units.end()), units.end());
  std::vector<int64_t> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t u : units) {
      int64_t& need = need_[static_cast<size_t>(u)];
      need = std::max(need, g);
      if (index_.slot_of(u) < 0 && writing_[static_cast<size_t>(u)] == 0) queued.push_back(u);
    }
    stats_.prefetch_queued += static_cast<int64_t>(queued.size());
  }
  pool_->submit(queued);
  return static_cast<int64_t>(queued.size());
}

void TrainTableStore::drain_prefetch() { pool_->drain(); }

void TrainTableStore::check() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty())
    fail(error_, "; table store ", dir_, " stopped: reopened (--resume) it rolls back to its checkpoint at step ", base_step_);
}

// Every dirty unit copied out (it stays cached, clean) and written with what is pending, then
// tables.bin fsynced and the log's header told the store holds `step`.
void TrainTableStore::flush(int64_t step) {
  check();
  pool_->drain();  // the read-ahead's jobs (and their write-backs) done: nothing else writes now
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t sl = 0; sl < dirty_.size(); ++sl)
      if (dirty_[sl]) copy_out(sl);
  }
  write_pending();
  std::lock_guard<std::mutex> writer(write_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  try {
    if (!error_.empty()) fail(error_);
    fsync_or_fail(fd_, data_path_);
    const std::string h = log_header(base_step_, step);  // the store now holds step: say so
    pwrite_all(log_fd_, h.data(), kHeader, 0, log_path_);
    fsync_or_fail(log_fd_, log_path_);
  } catch (const std::exception& e) {
    keep_error(e.what());
    fail(error_, "; table store ", dir_, " not flushed: reopened (--resume) it rolls back to its checkpoint at step ", base_step_);
  }
}

void TrainTableStore::seal(int64_t step) {
  std::lock_guard<std::mutex> writer(write_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  JTOK_CHECK(error_.empty(), "table store seal after an error");
  write_file_atomic(log_path_, log_header(step, -1));  // an empty log based at step replaces the old one
  if (log_fd_ >= 0) ::close(log_fd_);
  log_fd_ = ::open(log_path_.c_str(), O_RDWR);
  if (log_fd_ < 0) fail("cannot open the undo log ", log_path_, ": ", std::strerror(errno));
  log_end_ = kHeader;
  base_step_ = step;
  std::fill(logged_.begin(), logged_.end(), 0);
}

TrainTableStore::Stats TrainTableStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace jtok
