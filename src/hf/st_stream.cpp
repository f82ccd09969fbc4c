#include "hf/st_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/atomic_file.h"
#include "core/error.h"

namespace jtok {

uint64_t write_safetensors_streamed(const std::string& path, const std::map<std::string, StShape>& tensors,
                                    const std::map<std::string, std::string>& metadata, const StProducer& produce) {
  const StLayout L = safetensors_layout(tensors, metadata);
  std::map<uint64_t, std::string> in_order;  // offset -> name
  for (const auto& [name, off] : L.offset) in_order[off] = name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("cannot create ", path, ": ", std::strerror(errno));
  try {
    write_all(fd, L.head, path);
    uint64_t at = L.head.size();
    for (auto it = in_order.begin(); it != in_order.end(); ++it) {
      const uint64_t off = it->first;
      const std::string& name = it->second;  // not a structured binding: the lambda below captures it
      const uint64_t end = std::next(it) == in_order.end() ? L.size : std::next(it)->first;
      JTOK_CHECK(off == at, "tensor ", name, " at byte ", off, ", file at ", at);
      produce(name, [&](std::string_view bytes) {
        if (at + bytes.size() > end) fail(path, ": tensor ", name, " was given more bytes than its shape holds");
        write_all(fd, bytes, path);
        at += bytes.size();
      });
      if (at != end) fail(path, ": tensor ", name, " was given ", at - off, " bytes of ", end - off);
    }
    if (::fsync(fd) != 0) fail("fsync ", path, ": ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) fail("close ", path, ": ", std::strerror(errno));
  return L.size;
}

}  // namespace jtok
