// Crash-safe file writes: the content goes to PATH.tmp.<pid>, is fsync'ed, then renamed over
// PATH (and the directory fsync'ed), so readers see the old file or the whole new one.
#pragma once
#include <string>

namespace jtok {

void write_file_atomic(const std::string& path, const std::string& content);
// Reads a whole file; fails naming the path when it cannot.
std::string read_file(const std::string& path);

}  // namespace jtok
