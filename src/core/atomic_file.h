// Files that never exist half-written: write to "<path>.tmp.<pid>", fsync, rename over path,
// fsync the directory. A crash leaves either the old file or the new one. Directories likewise
// (publish_dir_atomic): filled under a temporary name beside, then renamed whole.
#pragma once
#include <cstdint>
#include <functional>
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
// A new directory `dir` that never exists half-written (an export, an import, a table store):
// `fill` writes every file of it into the temporary directory it is given, "<dir>.tmp" beside dir
// (a leftover of an interrupted run is removed first); then each file in it and the directory are
// fsynced, it is renamed to dir, and dir's parent is fsynced, so that the rename survives a crash.
// On any failure (fill's throw included) the temporary directory is removed and the error rethrown:
// nothing is left beside dir. dir must not exist (an error names it). `sync_dir` is the fsync of a
// directory (tests observe it; default fsync_dir).
void publish_dir_atomic(const std::string& dir, const std::function<void(const std::string& tmp)>& fill,
                        const std::function<void(const std::string&)>& sync_dir = fsync_dir);
std::string read_file(const std::string& path);
// n bytes of fd at byte `at` into dst, looping on short reads; an error or the end of the file fails
// naming path and the byte.
void read_all_at(int fd, void* dst, int64_t n, int64_t at, const std::string& path);

}  // namespace jtok
