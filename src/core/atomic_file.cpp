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

namespace {

// fsyncs one file the caller wrote (already synced by write_file_atomic: then nearly free).
void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open ", path, " to fsync it: ", std::strerror(errno));
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    fail("cannot fsync ", path, ": ", std::strerror(e));
  }
  ::close(fd);
}

// Every regular file under dir, then each directory, deepest first (a rename inside is durable).
void fsync_tree(const std::filesystem::path& dir, const std::function<void(const std::string&)>& sync_dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_directory() && !e.is_symlink()) fsync_tree(e.path(), sync_dir);
    else if (e.is_regular_file()) fsync_file(e.path().string());
  }
  sync_dir(dir.string());
}

}  // namespace

void publish_dir_atomic(const std::string& dir, const std::function<void(const std::string& tmp)>& fill,
                        const std::function<void(const std::string&)>& sync_dir) {
  namespace fs = std::filesystem;
  if (fs::exists(dir)) fail("cannot publish ", dir, ": it exists; give a new directory");
  fs::path out = fs::absolute(dir).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "out/": the temporary name beside out, not in it
  const fs::path tmp = out.string() + ".tmp";
  fs::remove_all(tmp);
  try {
    fs::create_directories(tmp);
    fill(tmp.string());
    fsync_tree(tmp, sync_dir);
    std::error_code ec;
    fs::rename(tmp, out, ec);
    if (ec) fail("cannot rename ", tmp.string(), " to ", dir, ": ", ec.message());
    sync_dir(out.parent_path().string());
  } catch (...) {
    std::error_code ec;  // after the rename tmp is gone: a failed fsync of the parent leaves dir, reported
    fs::remove_all(tmp, ec);
    throw;
  }
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
