// Fail-fast errors with a clear message. Library code throws jtok::Error; the jtok binary
// catches it at the top, prints one line "jtok: error: ..." and exits non-zero.
#pragma once
#include <stdexcept>
#include <string>
#include <sstream>

namespace jtok {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The device is lost for this process (CUDA's sticky errors: an illegal address, a failed launch,
// an uncorrectable ECC error, ...): every later call on it fails the same way, so nothing more can
// run there until the process restarts. A server stops taking work when it sees one.
struct DeviceLost : Error {
  using Error::Error;
};

// Builds a message from any streamable parts: fail("config ", path, ": field ", name, " ...").
template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw Error(os.str());
}

// Internal invariant: names the file and line, for bugs rather than bad input.
#define JTOK_CHECK(cond, ...)                                                               \
  do {                                                                                      \
    if (!(cond)) ::jtok::fail(__FILE__, ":", __LINE__, ": check failed: " #cond " ", ##__VA_ARGS__); \
  } while (0)

}  // namespace jtok
