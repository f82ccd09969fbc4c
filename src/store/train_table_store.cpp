#include "store/train_table_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "store/table_store.h"
#include "store/train_store_io.h"

namespace jtok {

namespace fs = std::filesystem;

using namespace train_store;

namespace {

constexpr const char* kFormat = "jtok-table-store-train-2";  // -1: units summed by FNV-1a 64

// (per_page, unit_bytes) of blocks of block_bytes: a unit keeps its last 8 bytes for its checksum.
std::pair<int64_t, int64_t> geometry(int64_t block_bytes) {
  if (block_bytes + kSum <= kPage) return {(kPage - kSum) / block_bytes, kPage};
  return {1, (block_bytes + kSum + kPage - 1) / kPage * kPage};
}

// A fresh log based at `step` replaces the old one atomically.
void write_empty_log(const std::string& path, int64_t step) { write_file_atomic(path, log_header(step, -1)); }

}  // namespace

void TrainTableStore::create(const std::string& dir, const std::vector<TrainStoreTable>& tables, int64_t V, int64_t step,
                             const RowSource& row) {
  JTOK_CHECK(!tables.empty() && V > 0, "training table store: ", tables.size(), " tables of ", V, " ids");
  if (fs::exists(dir)) fail("table store ", dir, " exists: choose a new directory (or --resume a run that made it)");
  nlohmann::json jt = nlohmann::json::array();
  std::vector<int64_t> offset;
  int64_t block = 0;
  for (const TrainStoreTable& t : tables) {
    offset.push_back(block);
    jt.push_back({{"name", t.name}, {"dim", t.dim}, {"offset", block}});
    block += t.layout().bytes();
  }
  const auto [per_page, unit_bytes] = geometry(block);
  const int64_t units = (V + per_page - 1) / per_page;
  const std::string tmp = dir + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const std::string data = (fs::path(tmp) / "tables.bin").string();
  const int fd = ::open(data.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("cannot create ", data, ": ", std::strerror(errno));
  std::vector<uint8_t> u(static_cast<size_t>(unit_bytes));
  const int32_t row_step = static_cast<int32_t>(step);
  try {
    for (int64_t n = 0; n < units; ++n) {
      std::fill(u.begin(), u.end(), 0);  // zero moments, zero padding
      for (int64_t id = n * per_page; id < std::min(V, (n + 1) * per_page); ++id) {
        uint8_t* b = u.data() + (id - n * per_page) * block;
        for (size_t k = 0; k < tables.size(); ++k) {
          const TrainRowLayout l = tables[k].layout();
          row(id, static_cast<int64_t>(k), l.value_at(b + offset[k]));
          l.write_step(b + offset[k], row_step);
        }
      }
      seal_unit(u.data(), unit_bytes);
      write_all(fd, std::string_view(reinterpret_cast<const char*>(u.data()), u.size()), data);
    }
    fsync_or_fail(fd, data);
  } catch (...) {
    ::close(fd);
    fs::remove_all(tmp);
    throw;
  }
  ::close(fd);
  write_empty_log((fs::path(tmp) / "undo.log").string(), step);
  const nlohmann::json manifest = {{"format", kFormat}, {"ids", V}, {"block_bytes", block}, {"per_page", per_page},
                                   {"unit_bytes", unit_bytes}, {"tables", jt}, {"data_file", "tables.bin"},
                                   {"data_bytes", units * unit_bytes}, {"log_file", "undo.log"}};
  write_file_atomic((fs::path(tmp) / "manifest.json").string(), manifest.dump(1) + "\n");
  fsync_dir(tmp);
  fs::rename(tmp, dir);
  fsync_dir(fs::path(dir).parent_path().empty() ? "." : fs::path(dir).parent_path().string());
}

namespace {

// The manifest's geometry, tables and data file name (checked: every error names the file).
void read_manifest(const std::string& mpath, const nlohmann::json& j, int64_t& ids, int64_t& block,
                   int64_t& per_page, int64_t& unit_bytes, std::vector<TrainStoreTable>& tables, std::string& data_file) {
  try {
    if (j.at("format").get<std::string>() == "jtok-table-store-train-1")
      fail(mpath, ": format jtok-table-store-train-1 (an older jtok's, its units summed by FNV-1a 64); this jtok reads ",
           kFormat, ": finish or export that run with the jtok that made it, or start a new store");
    if (j.at("format").get<std::string>() != kFormat)
      fail(mpath, ": format '", j.at("format").get<std::string>(), "', expected ", kFormat, " (a training store)");
    ids = j.at("ids").get<int64_t>();
    block = j.at("block_bytes").get<int64_t>();
    per_page = j.at("per_page").get<int64_t>();
    unit_bytes = j.at("unit_bytes").get<int64_t>();
    int64_t at = 0;
    for (const auto& t : j.at("tables")) {
      tables.push_back({t.at("name").get<std::string>(), t.at("dim").get<int64_t>(), t.at("offset").get<int64_t>()});
      if (tables.back().dim <= 0 || tables.back().offset != at)
        fail(mpath, ": table ", tables.back().name, " (dim ", tables.back().dim, " at offset ", tables.back().offset,
             ") does not follow the block's layout (offset ", at, " expected)");
      at += tables.back().layout().bytes();
    }
    const auto [pp, ub] = block > 0 ? geometry(block) : std::pair<int64_t, int64_t>{0, 0};
    if (ids <= 0 || block <= 0 || at != block || pp != per_page || ub != unit_bytes || tables.empty())
      fail(mpath, ": inconsistent block geometry (ids ", ids, ", block_bytes ", block, ", per_page ", per_page,
           ", unit_bytes ", unit_bytes, ")");
    const int64_t want = (ids + per_page - 1) / per_page * unit_bytes;
    if (j.at("data_bytes").get<int64_t>() != want) fail(mpath, ": data_bytes ", j.at("data_bytes").get<int64_t>(), ", expected ", want);
    data_file = j.at("data_file").get<std::string>();
    if (data_file.empty() || data_file.find('/') != std::string::npos) fail(mpath, ": data_file '", data_file, "' must be a file name in the store");
    if (j.at("log_file").get<std::string>() != "undo.log") fail(mpath, ": log_file must be undo.log");
  } catch (const nlohmann::json::exception& e) {
    fail(mpath, ": missing or mistyped field (", e.what(), ")");
  }
}

}  // namespace

std::shared_ptr<TrainTableStore> TrainTableStore::open(const std::string& dir, int64_t cache_bytes, int64_t step,
                                                       int io_threads, TableIo io) {
  std::string mpath;
  const nlohmann::json j = read_store_manifest(dir, &mpath);
  std::shared_ptr<TrainTableStore> s(new TrainTableStore());
  s->dir_ = dir;
  std::string data_file;
  read_manifest(mpath, j, s->ids_, s->block_bytes_, s->per_page_, s->unit_bytes_, s->tables_, data_file);
  s->units_ = (s->ids_ + s->per_page_ - 1) / s->per_page_;
  s->data_path_ = (fs::path(dir) / data_file).string();
  s->log_path_ = (fs::path(dir) / "undo.log").string();
  const int64_t want = s->units_ * s->unit_bytes_;
  if (!fs::exists(s->data_path_) || static_cast<int64_t>(fs::file_size(s->data_path_)) != want)
    fail(s->data_path_, ": ", fs::exists(s->data_path_) ? std::to_string(fs::file_size(s->data_path_)) : "no", " bytes, the manifest says ",
         want, " (a torn or truncated store)");
  s->fd_ = ::open(s->data_path_.c_str(), O_RDWR);
  if (s->fd_ < 0) fail("cannot open ", s->data_path_, ": ", std::strerror(errno));
  s->roll_back_or_drop_log(step);
  const int64_t n_slots = std::min(s->units_, std::max<int64_t>(2, cache_bytes / s->unit_bytes_));
  s->slots_.assign(static_cast<size_t>(n_slots * s->unit_bytes_ + kPage), 0);  // O_DIRECT wants aligned buffers
  const auto at = reinterpret_cast<uintptr_t>(s->slots_.data());
  s->slots_base_ = s->slots_.data() + (kPage - at % kPage) % kPage;
  if (use_direct_reads(io, s->data_path_)) s->direct_fd_ = open_for_reads(s->data_path_, true);
  s->index_.init(n_slots, s->units_);
  s->dirty_.assign(static_cast<size_t>(n_slots), 0);
  s->reading_.assign(static_cast<size_t>(n_slots), 0);
  s->need_.assign(static_cast<size_t>(s->units_), -1);
  s->writing_.assign(static_cast<size_t>(s->units_), 0);
  s->logged_.assign(static_cast<size_t>(s->units_), 0);
  // Test hook: JTOK_TEST_STORE_KILL_AT_WRITE=n kills the process (SIGKILL) in the middle of the
  // n-th unit write-back (half its bytes written): the torn page a crash leaves.
  if (const char* k = std::getenv("JTOK_TEST_STORE_KILL_AT_WRITE")) s->kill_at_write_ = std::atoll(k);
  if (io_threads < 1) fail("table store ", dir, ": ", io_threads, " I/O threads (at least 1)");
  TrainTableStore* raw = s.get();
  s->pool_ = std::make_unique<ReadPool>(io_threads, [raw](int64_t u) { raw->read_ahead_one(u); });
  return s;
}

UndoLogHeader read_undo_log_header(const std::string& path) {
  const int lfd = ::open(path.c_str(), O_RDONLY);
  if (lfd < 0) fail("cannot open the undo log ", path, ": ", std::strerror(errno), " (a store must have one)");
  const int64_t size = static_cast<int64_t>(fs::file_size(path));
  uint8_t h[kHeader];
  if (size < kHeader) {
    ::close(lfd);
    fail(path, ": ", size, " bytes, shorter than its ", kHeader, "-byte header (a torn log)");
  }
  try {
    pread_all(lfd, h, kHeader, 0, path);
  } catch (...) {
    ::close(lfd);
    throw;
  }
  ::close(lfd);
  UndoLogHeader out;
  uint64_t sum;
  std::memcpy(&out.base, h + 8, 8);
  std::memcpy(&out.target, h + 16, 8);
  std::memcpy(&sum, h + 24, 8);
  if (std::memcmp(h, kMagic, 8) != 0 || sum != fnv1a_bytes(kFnvOffset, h, 24)) fail(path, ": bad header (magic or checksum): not an undo log, or torn");
  return out;
}

void for_each_undo_record(const std::string& path, int64_t unit_bytes, int64_t units,
                          const std::function<void(int64_t unit_offset, int64_t log_offset, const uint8_t* bytes)>& each) {
  const int lfd = ::open(path.c_str(), O_RDONLY);
  if (lfd < 0) fail("cannot open the undo log ", path, ": ", std::strerror(errno));
  const int64_t size = static_cast<int64_t>(fs::file_size(path));
  std::vector<uint8_t> rec(static_cast<size_t>(kRecordHead + unit_bytes));
  try {
    for (int64_t at = kHeader; at + kRecordHead + unit_bytes <= size; at += kRecordHead + unit_bytes) {
      pread_all(lfd, rec.data(), static_cast<int64_t>(rec.size()), at, path);
      int64_t off;
      uint64_t rsum;
      std::memcpy(&off, rec.data(), 8);
      std::memcpy(&rsum, rec.data() + 8, 8);
      if (rsum != record_sum(rec.data(), rec.data() + kRecordHead, unit_bytes) ||
          off < 0 || off % unit_bytes != 0 || off >= units * unit_bytes)
        break;  // the torn last record
      each(off, at + kRecordHead, rec.data() + kRecordHead);
    }
  } catch (...) {
    ::close(lfd);
    throw;
  }
  ::close(lfd);
}

// The log at open for checkpoint step `step`: based at step -> its records written back (the store
// returns to step), stopping at the first torn record (its unit was never overwritten: the record
// is fsynced before the unit is written); target step -> the flush completed, nothing to undo.
// Then an empty log based at step.
void TrainTableStore::roll_back_or_drop_log(int64_t step) {
  const UndoLogHeader h = read_undo_log_header(log_path_);
  if (h.base != step && h.target != step)
    fail("table store ", dir_, " is at step ", h.base, h.target >= 0 ? " (committing step " + std::to_string(h.target) + ")" : "",
         " but the checkpoint resumed is at step ", step, " (", log_path_, "): resume the checkpoint the store belongs to");
  if (h.base == step) {
    int64_t restored = 0;
    for_each_undo_record(log_path_, unit_bytes_, units_, [&](int64_t off, int64_t, const uint8_t* bytes) {
      pwrite_all(fd_, bytes, unit_bytes_, off, data_path_);
      ++restored;
    });
    if (restored > 0) fsync_or_fail(fd_, data_path_);
  }
  write_empty_log(log_path_, step);
  base_step_ = step;
  log_end_ = kHeader;
  log_fd_ = ::open(log_path_.c_str(), O_RDWR);
  if (log_fd_ < 0) fail("cannot open the undo log ", log_path_, ": ", std::strerror(errno));
}

TrainTableStore::~TrainTableStore() {
  pool_.reset();  // its threads use the files and the cache
  if (fd_ >= 0) ::close(fd_);
  if (log_fd_ >= 0) ::close(log_fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
}

TrainStoreLayout read_train_store_layout(const std::string& dir) {
  TrainStoreLayout l;
  const nlohmann::json j = read_store_manifest(dir, &l.manifest);
  std::string data_file;
  read_manifest(l.manifest, j, l.ids, l.block_bytes, l.per_page, l.unit_bytes, l.tables, data_file);
  l.units = (l.ids + l.per_page - 1) / l.per_page;
  l.data_path = (fs::path(dir) / data_file).string();
  l.log_path = (fs::path(dir) / "undo.log").string();
  return l;
}

bool train_store_unit_ok(const uint8_t* unit, int64_t unit_bytes) { return unit_ok(unit, unit_bytes); }

}  // namespace jtok
