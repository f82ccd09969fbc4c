// How a disk table store (store/table_store.h, store/train_table_store.h) reads its file:
//   pread      through the page cache;
//   direct     O_DIRECT, past it (whole aligned pages into aligned buffers); a file system without
//              O_DIRECT is refused naming the file;
//   automatic  O_DIRECT where the file's file system takes it (a probe: an O_DIRECT open and one
//              aligned page read at offset 0), else pread. Under a memory limit that counts the page
//              cache, pread's copies are charged to the process and must be reclaimed; direct reads
//              are not (docs/benchmarks.md "Tables larger than memory").
#pragma once
#include <string>

namespace jtok {

enum class TableIo { pread, direct, automatic };

// "auto" | "direct" | "pread"; anything else fails naming `flag` and the value.
TableIo parse_table_io(const std::string& s, const std::string& flag);
// What a store opened with io reads with, for start-up lines: "O_DIRECT", "pread", or (auto on a
// file system without O_DIRECT) "pread (its file system has no O_DIRECT)".
const char* describe_table_reads(bool direct, TableIo io);
// True when path opens with O_DIRECT and its first page (or all of a shorter file) reads into an
// aligned buffer.
bool direct_reads_work(const std::string& path);
// io resolved for the file at path: true for direct reads.
bool use_direct_reads(TableIo io, const std::string& path);
// A descriptor of the store's data file at path for reads, with O_DIRECT when direct; a failure
// names the file (and, direct, the flag and a file system without O_DIRECT).
int open_for_reads(const std::string& path, bool direct);

}  // namespace jtok
