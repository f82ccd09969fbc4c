// Shared by the fuzz targets (tests/fuzz/fuzz_*.cpp): each defines LLVMFuzzerTestOneInput, built
// with libFuzzer by scripts/fuzz.sh and, in the normal build, with standalone_main.cpp, which feeds
// every committed seed and regression input (tests/fuzz/corpus/<target>/) once as a ctest.
// A parser may reject an input only with jtok::Error (a clear message); anything else that
// escapes (another exception type, a crash, a sanitizer report) is a finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace jtok::fuzz {

// A file holding the input (parsers that take a path); one per process, rewritten per input.
inline std::string write_input(const uint8_t* data, size_t size, const std::string& name = "input") {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/jtok_fuzz_XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    if (!d) std::abort();
    return std::string(d);
  }();
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

// Runs f; a jtok::Error is the expected way to refuse bad input.
template <typename F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const jtok::Error& e) {
    static const bool verbose = std::getenv("JTOK_FUZZ_VERBOSE") != nullptr;  // to check that seeds parse
    if (verbose) std::fprintf(stderr, "refused: %s\n", e.what());
  }
}

}  // namespace jtok::fuzz
