// A test-only LD_PRELOAD library that makes writes to chosen files fail the ways disks fail, for
// tests/test_write_faults.sh. Built by CMake (target write_fault_shim) without sanitizers; it is never
// linked into jtok. Driven by the environment:
//   JTOK_FAULT_PATH_SUBSTR  which files: those whose path contains this text (a trailing '$': whose
//                           path ends with it). The path of a file descriptor is read from
//                           /proc/self/fd; for rename, the old or the new path.
//   JTOK_FAULT_KIND         short_write  the write() / pwrite() that would take the bytes written to
//                                        matching files past JTOK_FAULT_AFTER_BYTES writes only up to
//                                        it (a short count), every later one fails with ENOSPC, as
//                                        a disk that fills up does
//                           eio_write    once JTOK_FAULT_AFTER_BYTES bytes are written, writes fail
//                                        with EIO
//                           fsync_eio    fsync() / fdatasync() of a matching file or directory fail
//                                        with EIO
//                           rename_fail  rename() / renameat() / renameat2() fail with EIO
//                           partial      every write to a matching file writes at most 1000 bytes
//                                        and succeeds: legal short counts that a writer must loop on
//                           eio_read     once JTOK_FAULT_AFTER_BYTES bytes have been read from
//                                        matching files, pread() / pread64() of them fail with EIO
//                                        (a disk's bad sector; reads, not writes, despite the name)
//                           no_direct    open() / openat() of a matching file with O_DIRECT fail with
//                                        EINVAL, as on a file system without direct I/O
//   JTOK_FAULT_AFTER_BYTES  see above (default 0)
// Each kind prints one line "write_fault_shim: KIND on PATH" to stderr the first time it acts, so a
// test can check that the fault it asked for happened.
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

enum class Kind { none, short_write, eio_write, fsync_eio, rename_fail, partial, eio_read, no_direct };

struct Config {
  Kind kind = Kind::none;
  std::string substr;
  bool anchored = false;  // substr must end the path
  unsigned long long after = 0;
};

const Config& config() {
  static const Config c = [] {
    Config c;
    const char* k = std::getenv("JTOK_FAULT_KIND");
    const char* s = std::getenv("JTOK_FAULT_PATH_SUBSTR");
    const char* a = std::getenv("JTOK_FAULT_AFTER_BYTES");
    if (!k || !s || !*s) return c;
    const std::string kind = k;
    c.kind = kind == "short_write" ? Kind::short_write
             : kind == "eio_write" ? Kind::eio_write
             : kind == "fsync_eio" ? Kind::fsync_eio
             : kind == "rename_fail" ? Kind::rename_fail
             : kind == "partial" ? Kind::partial
             : kind == "eio_read" ? Kind::eio_read
             : kind == "no_direct" ? Kind::no_direct
                                 : Kind::none;
    if (c.kind == Kind::none) {
      std::fprintf(stderr, "write_fault_shim: unknown JTOK_FAULT_KIND '%s'\n", k);
      std::abort();
    }
    c.substr = s;
    if (c.substr.back() == '$') {
      c.anchored = true;
      c.substr.pop_back();
    }
    c.after = a ? std::strtoull(a, nullptr, 10) : 0;
    return c;
  }();
  return c;
}

template <typename F>
F next(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (!f) std::abort();
  return reinterpret_cast<F>(f);
}

bool matches(const char* path) {
  if (!path) return false;
  const Config& c = config();
  const std::string p = path;
  if (c.anchored) return p.size() >= c.substr.size() && p.compare(p.size() - c.substr.size(), c.substr.size(), c.substr) == 0;
  return p.find(c.substr) != std::string::npos;
}

std::string fd_path(int fd) {
  char link[64], buf[PATH_MAX];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, buf, sizeof buf - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

void announce(Kind k, const std::string& path) {
  static std::atomic<bool> said[8];
  if (said[static_cast<int>(k)].exchange(true)) return;
  static const char* names[] = {"none", "short_write", "eio_write", "fsync_eio", "rename_fail", "partial", "eio_read", "no_direct"};
  const std::string line = std::string("write_fault_shim: ") + names[static_cast<int>(k)] + " on " + path + "\n";
  static auto real_write = next<ssize_t (*)(int, const void*, size_t)>("write");
  (void)!real_write(2, line.data(), line.size());
}

std::atomic<unsigned long long> written{0};  // bytes written to matching files
std::atomic<bool> full{false};               // short_write: the disk is full from now on

// How many of n bytes a write to fd may write (n: untouched), or -1 with errno set.
ssize_t allowed(int fd, size_t n) {
  const Config& c = config();
  if (c.kind != Kind::short_write && c.kind != Kind::eio_write && c.kind != Kind::partial) return static_cast<ssize_t>(n);
  const std::string path = fd_path(fd);
  if (!matches(path.c_str())) return static_cast<ssize_t>(n);
  if (c.kind == Kind::partial) {
    if (n > 1000) announce(c.kind, path);
    return static_cast<ssize_t>(n < 1000 ? n : 1000);
  }
  const unsigned long long done = written.load();
  if (c.kind == Kind::eio_write) {
    if (done + n <= c.after) return static_cast<ssize_t>(n);
    announce(c.kind, path);
    errno = EIO;
    return -1;
  }
  if (full.load() || (done >= c.after && n > 0)) {
    announce(c.kind, path);
    full = true;
    errno = ENOSPC;
    return -1;
  }
  if (done + n <= c.after) return static_cast<ssize_t>(n);
  announce(c.kind, path);
  full = true;
  return static_cast<ssize_t>(c.after - done);  // short, > 0
}

std::atomic<unsigned long long> read_bytes{0};  // bytes read from matching files (eio_read)

// eio_read: whether a read of n bytes from fd fails (errno set).
bool read_fails(int fd, size_t n) {
  const Config& c = config();
  if (c.kind != Kind::eio_read) return false;
  const std::string path = fd_path(fd);
  if (!matches(path.c_str())) return false;
  if (read_bytes.load() + n <= c.after) {
    read_bytes += n;
    return false;
  }
  announce(c.kind, path);
  errno = EIO;
  return true;
}

// no_direct: whether an open of path with flags fails (errno set).
bool direct_refused(const char* path, int flags) {
  if (config().kind != Kind::no_direct || !(flags & O_DIRECT) || !matches(path)) return false;
  announce(Kind::no_direct, path);
  errno = EINVAL;
  return true;
}

}  // namespace

extern "C" {

// The mode argument is read only when the flags say it is there (O_CREAT, O_TMPFILE).
#define JTOK_SHIM_MODE(flags)                           \
  mode_t mode = 0;                                      \
  if ((flags) & (O_CREAT | O_TMPFILE)) {                \
    va_list ap;                                         \
    va_start(ap, flags);                                \
    mode = static_cast<mode_t>(va_arg(ap, int));        \
    va_end(ap);                                         \
  }

int open(const char* path, int flags, ...) {
  static auto real = next<int (*)(const char*, int, ...)>("open");
  JTOK_SHIM_MODE(flags)
  return direct_refused(path, flags) ? -1 : real(path, flags, mode);
}

int open64(const char* path, int flags, ...) {
  static auto real = next<int (*)(const char*, int, ...)>("open64");
  JTOK_SHIM_MODE(flags)
  return direct_refused(path, flags) ? -1 : real(path, flags, mode);
}

int openat(int dir, const char* path, int flags, ...) {
  static auto real = next<int (*)(int, const char*, int, ...)>("openat");
  JTOK_SHIM_MODE(flags)
  return direct_refused(path, flags) ? -1 : real(dir, path, flags, mode);
}

ssize_t pread(int fd, void* buf, size_t n, off_t off) {
  static auto real = next<ssize_t (*)(int, void*, size_t, off_t)>("pread");
  return read_fails(fd, n) ? -1 : real(fd, buf, n, off);
}

ssize_t pread64(int fd, void* buf, size_t n, off64_t off) {
  static auto real = next<ssize_t (*)(int, void*, size_t, off64_t)>("pread64");
  return read_fails(fd, n) ? -1 : real(fd, buf, n, off);
}

ssize_t write(int fd, const void* buf, size_t n) {
  static auto real = next<ssize_t (*)(int, const void*, size_t)>("write");
  const ssize_t a = allowed(fd, n);
  if (a < 0) return -1;
  const ssize_t w = real(fd, buf, static_cast<size_t>(a));
  if (w > 0 && config().kind != Kind::none && matches(fd_path(fd).c_str())) written += static_cast<unsigned long long>(w);
  return w;
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  static auto real = next<ssize_t (*)(int, const void*, size_t, off_t)>("pwrite");
  const ssize_t a = allowed(fd, n);
  if (a < 0) return -1;
  const ssize_t w = real(fd, buf, static_cast<size_t>(a), off);
  if (w > 0 && config().kind != Kind::none && matches(fd_path(fd).c_str())) written += static_cast<unsigned long long>(w);
  return w;
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off64_t off) {
  static auto real = next<ssize_t (*)(int, const void*, size_t, off64_t)>("pwrite64");
  const ssize_t a = allowed(fd, n);
  if (a < 0) return -1;
  const ssize_t w = real(fd, buf, static_cast<size_t>(a), off);
  if (w > 0 && config().kind != Kind::none && matches(fd_path(fd).c_str())) written += static_cast<unsigned long long>(w);
  return w;
}

static int sync_fault(int fd) {
  if (config().kind != Kind::fsync_eio) return 0;
  const std::string path = fd_path(fd);
  if (!matches(path.c_str())) return 0;
  announce(Kind::fsync_eio, path);
  errno = EIO;
  return -1;
}

int fsync(int fd) {
  static auto real = next<int (*)(int)>("fsync");
  return sync_fault(fd) < 0 ? -1 : real(fd);
}

int fdatasync(int fd) {
  static auto real = next<int (*)(int)>("fdatasync");
  return sync_fault(fd) < 0 ? -1 : real(fd);
}

static bool rename_fault(const char* from, const char* to) {
  if (config().kind != Kind::rename_fail || !(matches(from) || matches(to))) return false;
  announce(Kind::rename_fail, std::string(from) + " -> " + to);
  errno = EIO;
  return true;
}

int rename(const char* from, const char* to) {
  static auto real = next<int (*)(const char*, const char*)>("rename");
  return rename_fault(from, to) ? -1 : real(from, to);
}

int renameat(int a, const char* from, int b, const char* to) {
  static auto real = next<int (*)(int, const char*, int, const char*)>("renameat");
  return rename_fault(from, to) ? -1 : real(a, from, b, to);
}

int renameat2(int a, const char* from, int b, const char* to, unsigned flags) {
  static auto real = next<int (*)(int, const char*, int, const char*, unsigned)>("renameat2");
  return rename_fault(from, to) ? -1 : real(a, from, b, to, flags);
}

}  // extern "C"
