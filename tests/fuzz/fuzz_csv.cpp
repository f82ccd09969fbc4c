// Scaling CSV tables (`jtok scaling fit` input).
#include "fuzz_util.h"
#include "scaling/table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  jtok::fuzz::expect_clean([&] { (void)jtok::parse_csv(text, "fuzz.csv"); });
  return 0;
}
