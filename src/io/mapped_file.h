// A file mapped read-only into memory (mmap): pages are read from the page cache when first
// touched, so resident memory is what is touched. Shared by everything that reads it in place
// (token tables: TokenTable::view keeps the mapping alive through a shared_ptr).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace jtok {

class MappedFile {
 public:
  // Maps the whole of `path` read-only; errors name the file.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const char* data_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
};

}  // namespace jtok
