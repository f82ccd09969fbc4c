// Files that never exist half-written: write to "<path>.tmp.<pid>", fsync, rename over path,
// fsync the directory. A crash leaves either the old file or the new one.
#pragma once
#include <string>
#include <string_view>

namespace jtok {

void write_file_atomic(const std::string& path, std::string_view bytes);
// fsyncs a directory (after renames inside it).
void fsync_dir(const std::string& dir);
std::string read_file(const std::string& path);

}  // namespace jtok
