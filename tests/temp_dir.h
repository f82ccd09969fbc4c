// Test directories under gtest's TempDir: named by a prefix, the pid and a counter, emptied first
// (a process of an earlier run with the same pid may have left one, and the stores refuse to write
// over a directory) and removed when the test process exits.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace jtok::testing {

inline std::string fresh_temp_dir(const std::string& prefix) {
  struct Made {
    std::vector<std::string> dirs;
    ~Made() {
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static Made made;
  static int n = 0;
  const std::string d = ::testing::TempDir() + prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(n++);
  std::filesystem::remove_all(d);
  made.dirs.push_back(d);
  return d;
}

}  // namespace jtok::testing
