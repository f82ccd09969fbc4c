// Files that never exist half-written: write to "<path>.tmp.<pid>", fsync, rename over path,
// fsync the directory. A crash leaves either the old file or the new one.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace jtok {

// Errors (a short write followed by a failing one, fsync, close or rename failing) name path and
// leave no file under path and no temporary file.
void write_file_atomic(const std::string& path, std::string_view bytes);
// The same for a file written in pieces under a temporary name of the caller's (tmp, in path's
// directory), called `label` in errors ("shard x.bin"); a label other than path also starts the
// errors of creating tmp and of the rename ("shard x.bin: cannot rename ...").
void write_file_atomic(const std::string& path, const std::string& tmp, std::initializer_list<std::string_view> pieces,
                       const std::string& label);
// All of bytes to fd, looping on short writes; errors name `what`.
void write_all(int fd, std::string_view bytes, const std::string& what);
// fsyncs a directory (after renames inside it); fails naming it if that fails.
void fsync_dir(const std::string& dir);
std::string read_file(const std::string& path);
// n bytes of fd at byte `at` into dst, looping on short reads; an error or the end of the file fails
// naming path and the byte.
void read_all_at(int fd, void* dst, int64_t n, int64_t at, const std::string& path);

}  // namespace jtok
