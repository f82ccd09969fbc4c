#include "infer/prefetch.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include "core/error.h"

namespace jtok {

std::vector<TableRow> table_rows_needed(const Model& m, const int32_t* ids, int64_t n) {
  const auto& c = m.cfg;
  std::vector<int32_t> u(ids, ids + n);
  for (int32_t id : u)
    if (id < 0 || id >= c.vocab_size) fail("token id ", id, " outside the vocabulary [0, ", c.vocab_size, ")");
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  std::vector<int32_t> tables;
  for (size_t l = 0; l < m.w.layers.size(); ++l) {
    if (l < m.jtok_table.size() && m.jtok_table[l] >= 0) tables.push_back(m.jtok_table[l]);
    if (l < m.jtokm_table.size() && m.jtokm_table[l] >= 0)
      for (int64_t e = 0; e < c.jtokm_n_e; ++e) tables.push_back(static_cast<int32_t>(m.jtokm_table[l] + e));
  }
  std::sort(tables.begin(), tables.end());
  tables.erase(std::unique(tables.begin(), tables.end()), tables.end());
  std::vector<TableRow> out;
  out.reserve(tables.size() * u.size());
  for (int32_t t : tables)
    for (int32_t id : u) out.push_back({t, id});
  return out;
}

int64_t touch_rows(const Model& m, const std::vector<TableRow>& rows) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  int64_t pages = 0;
  // All the hints first (the kernel reads them in parallel), then the touches (waits for each page).
  for (int pass = 0; pass < 2; ++pass)
    for (const TableRow& r : rows) {
      const TokenTable& t = m.tables[static_cast<size_t>(r.table)];
      if (!t.is_view() || r.row < 0 || r.row >= t.rows) continue;
      const uintptr_t begin = reinterpret_cast<uintptr_t>(t.raw_row(r.row));
      const uintptr_t lo = begin & ~(page - 1), hi = (begin + static_cast<uintptr_t>(t.row_stride_bytes()) + page - 1) & ~(page - 1);
      uintptr_t spans[2][2] = {{lo, hi}, {0, 0}};
      if (dtype_scaled(t.dtype())) {
        const uintptr_t s = reinterpret_cast<uintptr_t>(t.scales() + r.row) & ~(page - 1);
        spans[1][0] = s;
        spans[1][1] = s + page;
      }
      for (auto& sp : spans) {
        if (sp[1] == 0) continue;
        if (pass == 0) {
          madvise(reinterpret_cast<void*>(sp[0]), sp[1] - sp[0], MADV_WILLNEED);  // a hint: failure changes nothing
          continue;
        }
        for (uintptr_t p = sp[0]; p < sp[1]; p += page) {
          // One read per page (every page of the span holds some of the row's bytes, and a mapping
          // covers whole pages): the fault, if any, is taken here. Never written: read-only mapping.
          (void)*reinterpret_cast<const volatile char*>(p);
          pages++;
        }
      }
    }
  return pages;
}

RowPrefetcher::RowPrefetcher(const Model& m) : m_(m) {
  for (const auto& t : m.tables) useful_ = useful_ || t.is_view();
  if (useful_) thread_ = std::thread([this] { loop(); });
}

RowPrefetcher::~RowPrefetcher() {
  if (!useful_) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void RowPrefetcher::submit(std::vector<TableRow> rows) {
  if (!useful_ || rows.empty()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (jobs_.size() >= kMaxQueued) {
      jobs_.pop_front();
      stats_.dropped++;
    }
    jobs_.push_back(std::move(rows));
  }
  cv_.notify_all();
}

void RowPrefetcher::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_.wait(lk, [&] { return jobs_.empty() && !busy_; });
}

PrefetchStats RowPrefetcher::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

static int64_t thread_major_faults() {
  struct rusage ru {};
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_majflt;
}

void RowPrefetcher::loop() {
  for (;;) {
    std::vector<TableRow> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
    }
    const int64_t f0 = thread_major_faults();
    const int64_t pages = touch_rows(m_, job);
    const int64_t faults = thread_major_faults() - f0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      busy_ = false;
      stats_.jobs++;
      stats_.rows += static_cast<int64_t>(job.size());
      stats_.pages += pages;
      stats_.major_faults += faults;
    }
    idle_.notify_all();
  }
}

namespace {
// One disk table of each distinct store of m (run_setup's --tables disk gives one store for all).
std::vector<const TokenTable*> disk_tables(const Model& m) {
  std::vector<const TokenTable*> out;
  for (const auto& t : m.tables)
    if (const TableStore* s = table_store_of(t.disk_rows());
        s && std::none_of(out.begin(), out.end(), [&](const TokenTable* o) { return table_store_of(o->disk_rows()) == s; }))
      out.push_back(&t);
  return out;
}
}  // namespace

int64_t prefetch_disk_rows(const Model& m, const int32_t* ids, int64_t n) {
  int64_t queued = 0;
  for (const TokenTable* t : disk_tables(m)) queued += prefetch_rows(*t, ids, n);
  return queued;
}

std::optional<TableStore::Stats> disk_table_stats(const Model& m) {
  const std::vector<const TokenTable*> ts = disk_tables(m);
  if (ts.empty()) return std::nullopt;
  TableStore::Stats sum;
  for (const TokenTable* t : ts) {
    const TableStore::Stats s = table_store_of(t->disk_rows())->stats();
    sum.hits += s.hits, sum.misses += s.misses, sum.bytes_read += s.bytes_read, sum.waits += s.waits;
    sum.reads += s.reads, sum.read_ns += s.read_ns, sum.prefetch_reads += s.prefetch_reads;
    sum.prefetch_queued += s.prefetch_queued, sum.prefetch_skipped += s.prefetch_skipped;
  }
  return sum;
}

}  // namespace jtok
