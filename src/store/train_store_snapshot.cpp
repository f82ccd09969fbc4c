#include "store/train_store_snapshot.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"

namespace jtok {

namespace fs = std::filesystem;

std::unique_ptr<TrainStoreSnapshot> TrainStoreSnapshot::open(const std::string& dir, int64_t step,
                                                             const std::string& checkpoint) {
  std::unique_ptr<TrainStoreSnapshot> s(new TrainStoreSnapshot());
  s->l_ = read_train_store_layout(dir);
  const TrainStoreLayout& l = s->l_;
  const int64_t want = l.units * l.unit_bytes;
  if (!fs::exists(l.data_path) || static_cast<int64_t>(fs::file_size(l.data_path)) != want)
    fail(l.data_path, ": ", fs::exists(l.data_path) ? std::to_string(fs::file_size(l.data_path)) : "no", " bytes, the manifest says ",
         want, " (a torn or truncated store)");
  s->header_ = read_undo_log_header(l.log_path);
  const UndoLogHeader& h = s->header_;
  if (h.base != step && h.target != step)
    fail("table store ", dir, " is at step ", h.target >= 0 ? h.target : h.base, " (", l.log_path, "), the checkpoint ", checkpoint,
         " at step ", step, ": the store keeps only the tables of its newest checkpoint; export that one (or resume the run ",
         "from ", checkpoint, " with --tables disk, which rolls the store back to it)");
  s->log_size_ = static_cast<int64_t>(fs::file_size(l.log_path));
  s->from_log_.assign(static_cast<size_t>(l.units), -1);
  if (h.base == step)  // units overwritten since the step: their old bytes are in the log (the first record of each)
    for_each_undo_record(l.log_path, l.unit_bytes, l.units, [&](int64_t off, int64_t at, const uint8_t*) {
      int64_t& f = s->from_log_[static_cast<size_t>(off / l.unit_bytes)];
      if (f < 0) f = at, ++s->from_log_count_;
    });
  s->fd_ = ::open(l.data_path.c_str(), O_RDONLY);
  if (s->fd_ < 0) fail("cannot open ", l.data_path, ": ", std::strerror(errno));
  s->log_fd_ = ::open(l.log_path.c_str(), O_RDONLY);
  if (s->log_fd_ < 0) fail("cannot open ", l.log_path, ": ", std::strerror(errno));
  return s;
}

TrainStoreSnapshot::~TrainStoreSnapshot() {
  if (fd_ >= 0) ::close(fd_);
  if (log_fd_ >= 0) ::close(log_fd_);
}

void TrainStoreSnapshot::read_unit(int64_t u, uint8_t* buf) const {
  JTOK_CHECK(u >= 0 && u < l_.units, "train store snapshot: unit ", u, " of ", l_.units);
  const int64_t at = from_log_[static_cast<size_t>(u)];
  if (at >= 0) read_all_at(log_fd_, buf, l_.unit_bytes, at, l_.log_path);
  else read_all_at(fd_, buf, l_.unit_bytes, u * l_.unit_bytes, l_.data_path);
  if (!train_store_unit_ok(buf, l_.unit_bytes))
    fail(at >= 0 ? l_.log_path : l_.data_path, ": unit ", u, " (tables.bin bytes ", u * l_.unit_bytes, "..", (u + 1) * l_.unit_bytes,
         ") fails its checksum (a torn or altered store)");
}

void TrainStoreSnapshot::check_unchanged() const {
  const UndoLogHeader h = read_undo_log_header(l_.log_path);
  if (h.base != header_.base || h.target != header_.target || static_cast<int64_t>(fs::file_size(l_.log_path)) != log_size_)
    fail(l_.log_path, " changed while the store was read (a trainer is using the store?): stop it and export again");
}

}  // namespace jtok
