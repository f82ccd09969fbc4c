// Files that never exist half-written: write to "<path>.tmp.<pid>", fsync, rename over path,
// fsync the directory. A crash leaves either the old file or the new one.
#pragma once
#include <string>
#include <string_view>

namespace jtok {

// Errors (a short write followed by a failing one, fsync, close or rename failing) name path and
// leave no file under path and no temporary file.
void write_file_atomic(const std::string& path, std::string_view bytes);
// All of bytes to fd, looping on short writes; errors name `what`.
void write_all(int fd, std::string_view bytes, const std::string& what);
// fsyncs a directory (after renames inside it); fails naming it if that fails.
void fsync_dir(const std::string& dir);
std::string read_file(const std::string& path);

}  // namespace jtok
