#include "core/atomic_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "core/error.h"

namespace jtok {

void fsync_dir(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open directory ", d, " to fsync it: ", std::strerror(errno));
  // EINVAL: a file system that cannot sync directories (the rename is then as durable as it gets).
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int e = errno;
    ::close(fd);
    fail("cannot fsync directory ", d, ": ", std::strerror(e));
  }
  ::close(fd);
}

void write_all(int fd, std::string_view bytes, const std::string& what) {
  size_t done = 0;
  while (done < bytes.size()) {
    // write() may write fewer bytes than asked (a signal, a pipe, a nearly full disk): loop on the
    // rest; the write after a short one reports the error (ENOSPC, EIO) if there is one.
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail("cannot write ", what, ": ", std::strerror(errno));
    if (w == 0) fail("cannot write ", what, ": write() wrote nothing after ", done, " of ", bytes.size(), " bytes");
    done += static_cast<size_t>(w);
  }
}

void read_all_at(int fd, void* dst, int64_t n, int64_t at, const std::string& path) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, static_cast<size_t>(n), at);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) fail("cannot read ", path, " at byte ", at, ": ", got < 0 ? std::strerror(errno) : "end of file (truncated)");
    p += got, n -= got, at += got;
  }
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  write_file_atomic(path, path + ".tmp." + std::to_string(::getpid()), {bytes}, path);
}

void write_file_atomic(const std::string& path, const std::string& tmp, std::initializer_list<std::string_view> pieces,
                       const std::string& label) {
  const std::string what = label + " (temporary " + tmp + ")";
  const std::string prefix = label == path ? "" : label + ": ";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(prefix, "cannot create ", tmp, ": ", std::strerror(errno));
  try {
    for (std::string_view bytes : pieces) write_all(fd, bytes, what);
    if (::fsync(fd) != 0) fail("cannot fsync ", what, ": ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {  // NFS and some others report a failed write-back only here
    const int e = errno;
    ::unlink(tmp.c_str());
    fail("cannot close ", what, ": ", std::strerror(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail(prefix, "cannot rename ", tmp, " to ", path, ": ", std::strerror(e));
  }
  fsync_dir(std::filesystem::path(path).parent_path().string());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read ", path, ": ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace jtok
