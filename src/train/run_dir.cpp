#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

#include "core/error.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;

namespace jtok {

namespace {

// Checkpoint directories (complete or not) under dir/checkpoints.
int count_checkpoint_dirs(const fs::path& dir) {
  int n = 0;
  const fs::path root = dir / "checkpoints";
  if (!fs::is_directory(root)) return 0;
  for (auto& e : fs::directory_iterator(root))
    if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0) ++n;
  return n;
}

}  // namespace

void claim_run_dir(const std::string& dir, bool resume, bool overwrite) {
  const fs::path d(dir);
  if (!resume) {
    const fs::path log = d / "log.jsonl";
    const int n_ck = count_checkpoint_dirs(d);
    const bool has_log = fs::exists(log);
    if (n_ck > 0 || has_log) {
      const auto newest = latest_checkpoint(dir);
      std::string what = newest ? "checkpoints up to " + fs::path(*newest).filename().string()
                                : (n_ck > 0 ? "incomplete checkpoints" : "a log.jsonl");
      if (!overwrite)
        fail(dir, " already holds a run (", what, "): use --resume to continue it, another --out for a new run, "
             "or --overwrite to delete its checkpoints and log");
      if (n_ck > 0) fs::remove_all(d / "checkpoints");
      if (has_log) fs::remove(log);
      std::printf("overwrite: removed %d checkpoint director%s%s%s of the previous run in %s\n", n_ck, n_ck == 1 ? "y" : "ies",
                  newest ? (" (newest " + fs::path(*newest).filename().string() + ")").c_str() : "",
                  has_log ? " and its log.jsonl" : "", dir.c_str());
    }
  }
  std::error_code ec;
  fs::create_directories(d, ec);
  if (ec) fail(dir, ": cannot create the run directory: ", ec.message());
}

std::string new_run_id() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now).count();
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%llx-%x-%08x", static_cast<unsigned long long>(us), static_cast<unsigned>(::getpid()),
                static_cast<unsigned>(rd()));
  return buf;
}

RunDirLock::RunDirLock(const std::string& dir) {
  const std::string path = (fs::path(dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
  if (fd_ < 0) fail("cannot create ", path);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    fd_ = -1;
    fail(dir, " is in use by another jtok train (", path, " is locked); wait for it or pick another --out");
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace jtok
