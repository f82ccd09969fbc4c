#include "store/table_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/checksum.h"
#include "core/error.h"

namespace jtok {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kPage = 4096;
// -2: the data file summed by sum64_pages (core/checksum.h), manifest field sum64; -1 (still read):
// by FNV-1a 64, field fnv1a64, which ran at 0.6 GB/s: seconds of a large store's open.
constexpr const char* kFormat = "jtok-table-store-2";
constexpr const char* kFormatFnv = "jtok-table-store-1";

int64_t align4(int64_t x) { return (x + 3) / 4 * 4; }

// The block geometry of a store whose blocks are block_bytes: (per_page, stride). Two or more blocks
// a page are packed in it; a block of more than half a page takes whole pages (stride a multiple of
// 4 KiB), so every write, checksum unit and direct read of the file is whole pages.
std::pair<int64_t, int64_t> geometry(int64_t block_bytes) {
  if (2 * block_bytes <= kPage) return {kPage / block_bytes, block_bytes};
  return {1, (block_bytes + kPage - 1) / kPage * kPage};
}

int64_t data_bytes(int64_t ids, int64_t per_page, int64_t stride) {
  return per_page > 1 ? (ids + per_page - 1) / per_page * kPage : ids * stride;
}

// A page-aligned buffer of at least `bytes` for this thread's O_DIRECT reads, kept between reads
// (the gathers and the I/O threads read in parallel); null when no memory can be had.
uint8_t* direct_buffer(int64_t bytes) {
  struct Buffer {
    void* p = nullptr;
    int64_t n = 0;
    ~Buffer() { std::free(p); }
  };
  thread_local Buffer b;
  if (b.n < bytes) {
    std::free(b.p);
    b.p = nullptr;
    b.n = 0;
    if (::posix_memalign(&b.p, kPage, static_cast<size_t>(bytes)) != 0) return nullptr;  // b.p untouched: null
    b.n = bytes;
  }
  return static_cast<uint8_t*>(b.p);
}

nlohmann::json source_json(const TableStoreSource& s) {
  if (!s.random.empty()) return {{"random", s.random}};
  nlohmann::json j = {{"checkpoint", s.checkpoint}};
  if (s.step >= 0) j["step"] = s.step;
  if (!s.train_store.empty()) j["train_store"] = s.train_store, j["train_store_step"] = s.train_store_step;
  return j;
}

TableStoreSource parse_source(const nlohmann::json& j) {  // a mistyped field throws (open names the manifest)
  TableStoreSource s;
  if (j.contains("random")) {
    s.random = j.at("random").get<std::string>();
    return s;
  }
  s.checkpoint = j.at("checkpoint").get<std::string>();
  if (j.contains("step")) s.step = j.at("step").get<int64_t>();
  if (j.contains("train_store")) s.train_store = j.at("train_store").get<std::string>();
  if (j.contains("train_store_step")) s.train_store_step = j.at("train_store_step").get<int64_t>();
  return s;
}

}  // namespace

std::string dir_basename(const std::string& dir) {
  fs::path p = fs::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

std::string describe_source(const TableStoreSource& s) {
  if (!s.random.empty()) return "a random model's tables (" + s.random + "), no checkpoint";
  if (s.checkpoint.empty()) return "source not recorded (a store written before manifests named their checkpoint)";
  std::string out = "exported from checkpoint " + s.checkpoint + (s.step >= 0 ? ", step " + std::to_string(s.step) : ", step not recorded");
  if (!s.train_store.empty())
    out += " (trained with --tables disk: training store " + s.train_store + " read at step " + std::to_string(s.train_store_step) + ")";
  return out;
}

void write_table_store(const std::string& dir, int64_t V, const std::vector<TableStoreSpec>& tables, const StoreRowSource& row,
                       const TableStoreSource& source) {
  JTOK_CHECK(!tables.empty() && V > 0, "table store: ", tables.size(), " tables of ", V, " ids");
  if (fs::exists(dir)) fail("table store ", dir, " exists: choose a new directory");
  nlohmann::json jt = nlohmann::json::array();
  std::vector<int64_t> offset;
  int64_t block = 0;
  for (const TableStoreSpec& t : tables) {
    offset.push_back(block);
    jt.push_back({{"name", t.name}, {"dim", t.dim}, {"dtype", dtype_name(t.dtype)}, {"offset", block}});
    block = align4(block + dtype_row_bytes(t.dtype, t.dim) + (dtype_scaled(t.dtype) ? 4 : 0));
  }
  const auto [per_page, stride] = geometry(block);
  const int64_t total = data_bytes(V, per_page, stride);
  const std::string tmp = dir + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const std::string data = (fs::path(tmp) / "tables.bin").string();
  const int fd = ::open(data.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("cannot create ", data, ": ", std::strerror(errno));
  uint64_t sum = kFnvOffset;
  std::vector<uint8_t> page(static_cast<size_t>(std::max(kPage, stride)));
  const int64_t unit = per_page > 1 ? kPage : stride, tokens = per_page > 1 ? per_page : 1;
  try {
    for (int64_t first = 0; first < V; first += tokens) {  // one page (or one token's pages) a write
      std::fill(page.begin(), page.end(), 0);
      for (int64_t id = first; id < std::min(V, first + tokens); ++id) {
        uint8_t* b = page.data() + (id - first) * (per_page > 1 ? block : 0);
        for (size_t k = 0; k < tables.size(); ++k) {
          const int64_t bytes = dtype_row_bytes(tables[k].dtype, tables[k].dim);
          float scale = 0.0f;
          row(id, static_cast<int64_t>(k), b + offset[k], &scale);
          if (dtype_scaled(tables[k].dtype)) std::memcpy(b + offset[k] + bytes, &scale, 4);
        }
      }
      sum = sum64_pages(sum, page.data(), static_cast<size_t>(unit));
      write_all(fd, std::string_view(reinterpret_cast<const char*>(page.data()), static_cast<size_t>(unit)), data);
    }
    if (::fsync(fd) != 0) fail("cannot fsync ", data, ": ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    fs::remove_all(tmp);
    throw;
  }
  ::close(fd);
  nlohmann::json manifest = {{"format", kFormat}, {"ids", V}, {"block_bytes", block}, {"per_page", per_page},
                             {"stride", stride}, {"page_bytes", kPage}, {"tables", jt},
                             {"data_file", "tables.bin"}, {"data_bytes", total}, {"sum64", std::to_string(sum)}};
  if (!source.checkpoint.empty() || !source.random.empty()) manifest["source"] = source_json(source);
  write_file_atomic((fs::path(tmp) / "manifest.json").string(), manifest.dump(1) + "\n");
  fsync_dir(tmp);
  fs::rename(tmp, dir);
  fsync_dir(fs::path(dir).parent_path().empty() ? "." : fs::path(dir).parent_path().string());
}

nlohmann::json read_store_manifest(const std::string& dir, std::string* path) {
  const std::string mpath = (fs::path(dir) / "manifest.json").string();
  if (!fs::exists(mpath)) fail("table store ", dir, ": no manifest.json (not a store, or an interrupted write)");
  *path = mpath;
  try {
    return nlohmann::json::parse(read_file(mpath));
  } catch (const std::exception& e) {
    fail(mpath, ": not valid JSON (", e.what(), ")");
  }
}

std::shared_ptr<TableStore> TableStore::open(const std::string& dir, int64_t cache_bytes, int io_threads, TableIo io) {
  std::string mpath;
  const nlohmann::json j = read_store_manifest(dir, &mpath);
  std::shared_ptr<TableStore> s(new TableStore());
  s->dir_ = dir;
  try {
    const std::string format = j.at("format").get<std::string>();
    if (format.rfind("jtok-table-store-train-", 0) == 0)  // store/train_table_store.h: rows with moments, maybe owing steps
      fail("table store ", dir, " is a training store (jtok train --tables disk, ", mpath, "): convert it for --tables disk with "
           "`jtok export --checkpoint CK --table-store OUT [--table-dtype bf16|int8|int4]` (CK: the run's checkpoint at the store's step) "
           "and pass --table-store OUT");
    if (format != kFormat && format != kFormatFnv) fail(mpath, ": format '", format, "', expected ", kFormat);
    s->ids_ = j.at("ids").get<int64_t>();
    s->block_bytes_ = j.at("block_bytes").get<int64_t>();
    s->per_page_ = j.at("per_page").get<int64_t>();
    s->stride_ = j.at("stride").get<int64_t>();
    for (const auto& t : j.at("tables"))
      s->tables_.push_back({t.at("name").get<std::string>(), t.at("dim").get<int64_t>(),
                            parse_dtype(t.at("dtype").get<std::string>(), mpath + " field dtype",
                                        {Dtype::f32, Dtype::bf16, Dtype::int8, Dtype::int4}),
                            t.at("offset").get<int64_t>()});
    s->data_path_ = (fs::path(dir) / j.at("data_file").get<std::string>()).string();
    if (j.contains("source")) s->source_ = parse_source(j.at("source"));  // older stores have none
    const auto [pp, st] = s->block_bytes_ > 0 ? geometry(s->block_bytes_) : std::pair<int64_t, int64_t>{0, 0};
    if (s->ids_ <= 0 || s->block_bytes_ <= 0 || pp != s->per_page_ || st != s->stride_ || s->tables_.empty())
      fail(mpath, ": inconsistent block geometry (ids ", s->ids_, ", block_bytes ", s->block_bytes_, ", per_page ",
           s->per_page_, ", stride ", s->stride_, "; expected per_page ", pp, ", stride ", st,
           ": a store of blocks of 2-4 KiB written before jtok gave them whole pages never opened; export it again)");
    for (const auto& t : s->tables_)
      if (t.dim <= 0 || t.offset < 0 ||
          t.offset + dtype_row_bytes(t.dtype, t.dim) + (dtype_scaled(t.dtype) ? 4 : 0) > s->block_bytes_)
        fail(mpath, ": table ", t.name, " (dim ", t.dim, " at offset ", t.offset, ") does not fit the ", s->block_bytes_,
             "-byte block");
    const int64_t want = data_bytes(s->ids_, s->per_page_, s->stride_);
    if (j.at("data_bytes").get<int64_t>() != want) fail(mpath, ": data_bytes ", j.at("data_bytes").get<int64_t>(), ", expected ", want);
    if (!fs::exists(s->data_path_) || static_cast<int64_t>(fs::file_size(s->data_path_)) != want)
      fail(s->data_path_, ": ", fs::exists(s->data_path_) ? std::to_string(fs::file_size(s->data_path_)) : "no", " bytes, the manifest says ",
           want, " (a torn or truncated store)");
    const bool direct_io = use_direct_reads(io, s->data_path_);
    s->direct_ = direct_io;
    s->read_bytes_ = !direct_io ? s->block_bytes_ : s->per_page_ > 1 ? kPage : s->stride_;
    s->fd_ = open_for_reads(s->data_path_, direct_io);
    s->verify_checksum(j, want);
  } catch (const nlohmann::json::exception& e) {
    fail(mpath, ": missing or mistyped field (", e.what(), ")");
  }
  const int64_t n_slots = std::max<int64_t>(s->per_page_, cache_bytes / s->block_bytes_);
  s->slots_.assign(static_cast<size_t>(std::min(n_slots, s->ids_) * s->block_bytes_), 0);
  s->index_.init(std::min(n_slots, s->ids_), s->ids_);
  s->state_.assign(static_cast<size_t>(s->index_.slots()), kReady);
  if (io_threads < 1) fail("table store ", dir, ": ", io_threads, " I/O threads (at least 1)");
  TableStore* raw = s.get();
  s->pool_ = std::make_unique<ReadPool>(io_threads, [raw](int64_t id) { raw->prefetch_one(id); });
  return s;
}

// The whole file, 1 MiB a read (page-aligned: with O_DIRECT this is also the probe of direct reads).
void TableStore::verify_checksum(const nlohmann::json& j, int64_t want) {
  constexpr int64_t kChunk = 1 << 20;
  void* p = nullptr;
  if (::posix_memalign(&p, kPage, kChunk) != 0) fail("table store ", dir_, ": no memory for the checksum's buffer");
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t*>(p), &std::free);
  const bool fnv = j.at("format").get<std::string>() == kFormatFnv;  // an older store
  const std::string field = fnv ? "fnv1a64" : "sum64", expected = j.at(field).get<std::string>();
  uint64_t sum = kFnvOffset;
  for (int64_t at = 0; at < want;) {
    ssize_t n;
    do {
      n = ::pread(fd_, buf.get(), static_cast<size_t>(std::min(want - at, kChunk)), at);
    } while (n < 0 && errno == EINTR);
    if (n <= 0)
      fail("cannot read ", data_path_, " at byte ", at, ": ", n < 0 ? std::strerror(errno) : "end of file",
           direct_ && n < 0 && errno == EINVAL ? " (its file system refuses direct reads: run with --table-io pread)" : "");
    sum = fnv ? fnv1a_bytes(sum, buf.get(), static_cast<size_t>(n)) : sum64_pages(sum, buf.get(), static_cast<size_t>(n));
    at += n;
  }
  if (std::to_string(sum) != expected)
    fail(data_path_, ": checksum ", sum, " differs from the manifest's ", field, " ", expected,
         " (the store was altered or torn)");
}

TableStore::~TableStore() {
  pool_.reset();  // its threads read fd_
  if (fd_ >= 0) ::close(fd_);
}

int64_t TableStore::block_offset(int64_t id) const {
  return per_page_ > 1 ? id / per_page_ * kPage + id % per_page_ * block_bytes_ : id * stride_;
}

int64_t TableStore::read_offset(int64_t id) const {
  return !direct_ ? block_offset(id) : per_page_ > 1 ? id / per_page_ * kPage : id * stride_;
}

// CLOCK: a hit sets the slot's reference bit; a miss sweeps the hand past referenced slots
// (clearing their bit) to the first unreferenced one that is not being read.
int64_t TableStore::claim_slot() const {
  const int64_t h = index_.claim([&](int64_t s) { return state_[static_cast<size_t>(s)] != kReady; });
  if (h >= 0) index_.unbind(h);
  return h;
}

// With O_DIRECT the block's whole aligned page(s) come into this thread's aligned buffer and the
// block is copied out of it; otherwise the block is read straight into its slot.
bool TableStore::read_block(int64_t id, int64_t slot, int64_t* ns, std::string* why) const {
  const auto t0 = std::chrono::steady_clock::now();
  uint8_t* dst = slots_.data() + slot * block_bytes_;
  uint8_t* buf = direct_ ? direct_buffer(read_bytes_) : dst;
  ssize_t got = -1;
  int err = ENOMEM;
  if (buf) {
    do {
      got = ::pread(fd_, buf, static_cast<size_t>(read_bytes_), read_offset(id));
    } while (got < 0 && errno == EINTR);
    err = errno;
  }
  if (got == read_bytes_ && direct_) std::memcpy(dst, buf + (block_offset(id) - read_offset(id)), static_cast<size_t>(block_bytes_));
  *ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  if (got == read_bytes_) return true;
  if (why)
    *why = "cannot read token " + std::to_string(id) + " of " + data_path_ + " at byte " + std::to_string(read_offset(id)) +
           " (its " + std::to_string(block_bytes_) + "-byte block" +
           (direct_ ? ", the " + std::to_string(read_bytes_) + " bytes of its pages with O_DIRECT" : std::string()) + "): " +
           (got < 0 ? std::string(std::strerror(err))
                    : "only " + std::to_string(got) + " bytes (the file is shorter than when it was opened: truncated?)");
  return false;
}

void TableStore::finish_read(int64_t id, int64_t slot, bool ok, int64_t ns, bool prefetched) const {
  const size_t s = static_cast<size_t>(slot);
  state_[s] = kReady;
  if (ok) {
    index_.touch(slot);
    stats_.reads++;
    stats_.read_ns += ns;
    stats_.bytes_read += read_bytes_;
    if (prefetched) stats_.prefetch_reads++;
  } else {  // freed: the next reader reads it again (and reports the error)
    index_.unbind(slot);
  }
  read_done_.notify_all();
}

const uint8_t* TableStore::block(int64_t id, std::unique_lock<std::mutex>& lock) const {
  bool waited = false;
  for (;;) {
    int64_t slot = index_.slot_of(id);
    if (slot >= 0 && state_[static_cast<size_t>(slot)] == kReady) {
      ++(waited ? stats_.waits : stats_.hits);
      index_.touch(slot);
      return slots_.data() + slot * block_bytes_;
    }
    if (slot >= 0 && state_[static_cast<size_t>(slot)] == kReading) {  // one read per block: wait for it
      waited = true;
      read_done_.wait(lock);
      continue;
    }
    if (slot < 0) {  // not cached: a slot of our own
      slot = claim_slot();
      if (slot < 0) {
        read_done_.wait(lock);
        continue;
      }
      index_.bind(slot, id);
    }  // else queued for an I/O thread that has not started: read it here (the thread skips it)
    state_[static_cast<size_t>(slot)] = kReading;
    lock.unlock();
    int64_t ns = 0;
    std::string why;
    const bool ok = read_block(id, slot, &ns, &why);
    lock.lock();
    finish_read(id, slot, ok, ns, false);
    if (!ok) {  // kept for take_error(): the gathers run in parallel loops, which an exception cannot leave
      if (error_.empty()) error_ = why;
      return nullptr;
    }
    ++stats_.misses;
    return slots_.data() + slot * block_bytes_;
  }
}

void TableStore::read_raw(int64_t k, int64_t id, void* raw, float* scale) const {
  const TableStoreTable& t = tables_[static_cast<size_t>(k)];
  std::unique_lock<std::mutex> lock(mu_);
  const uint8_t* b = block(id, lock);  // copied under the lock: the slot cannot be reused meanwhile
  const int64_t bytes = dtype_row_bytes(t.dtype, t.dim);
  if (!b) {  // a failed read: zeros (the caller's take_error() reports it)
    std::memset(raw, 0, static_cast<size_t>(bytes));
    *scale = 0.0f;
    return;
  }
  std::memcpy(raw, b + t.offset, static_cast<size_t>(bytes));
  if (dtype_scaled(t.dtype)) std::memcpy(scale, b + t.offset + bytes, sizeof(float));
}

std::string TableStore::take_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(error_, std::string());
}

int64_t TableStore::prefetch(const int32_t* ids, int64_t n) const {
  std::vector<int32_t> u(ids, ids + n);
  for (int32_t id : u)
    if (id < 0 || id >= ids_) fail("table store ", dir_, ": prefetch of token id ", id, " outside [0, ", ids_, ")");
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  std::vector<int64_t> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t budget = std::max<int64_t>(1, index_.slots() / 2);
    for (int32_t id : u) {
      if (index_.slot_of(id) >= 0) continue;  // cached, queued or being read
      const int64_t slot = static_cast<int64_t>(queued.size()) < budget ? claim_slot() : -1;
      if (slot < 0) {
        stats_.prefetch_skipped++;
        continue;
      }
      index_.bind(slot, id);
      state_[static_cast<size_t>(slot)] = kQueued;
      queued.push_back(id);
    }
    stats_.prefetch_queued += static_cast<int64_t>(queued.size());
  }
  pool_->submit(queued);
  return static_cast<int64_t>(queued.size());
}

void TableStore::prefetch_one(int64_t id) const {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t slot = index_.slot_of(id);
  if (slot < 0 || state_[static_cast<size_t>(slot)] != kQueued) return;  // a reader took it over
  state_[static_cast<size_t>(slot)] = kReading;
  lock.unlock();
  int64_t ns = 0;
  const bool ok = read_block(id, slot, &ns, nullptr);  // a failure frees the slot: a reader reads it again, and reports
  lock.lock();
  finish_read(id, slot, ok, ns, true);
}

void TableStore::drain_prefetch() const { pool_->drain(); }

TableStore::Stats TableStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace jtok
