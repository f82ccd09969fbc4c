#include "store/table_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace jtok {

TableIo parse_table_io(const std::string& s, const std::string& flag) {
  if (s == "auto") return TableIo::automatic;
  if (s == "direct") return TableIo::direct;
  if (s == "pread") return TableIo::pread;
  fail(flag, " must be auto, direct or pread, got '", s, "'");
}

const char* describe_table_reads(bool direct, TableIo io) {
  return direct ? "O_DIRECT" : io == TableIo::automatic ? "pread (its file system has no O_DIRECT)" : "pread";
}

bool direct_reads_work(const std::string& path) {
  constexpr size_t kPage = 4096;
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return false;
  void* p = nullptr;
  if (::posix_memalign(&p, kPage, kPage) != 0) {
    ::close(fd);
    return false;
  }
  std::unique_ptr<void, decltype(&std::free)> buf(p, &std::free);
  ssize_t n;
  do {
    n = ::pread(fd, buf.get(), kPage, 0);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  return n >= 0;
}

bool use_direct_reads(TableIo io, const std::string& path) {
  return io == TableIo::direct || (io == TableIo::automatic && direct_reads_work(path));
}

int open_for_reads(const std::string& path, bool direct) {
  const int fd = ::open(path.c_str(), O_RDONLY | (direct ? O_DIRECT : 0));
  if (fd < 0)
    fail("cannot open ", path, direct ? " for direct I/O (--table-io direct)" : "", ": ", std::strerror(errno),
         direct && errno == EINVAL ? " (its file system has no O_DIRECT: run with --table-io pread or auto, which read "
                                     "through the page cache)" : "");
  return fd;
}

}  // namespace jtok
