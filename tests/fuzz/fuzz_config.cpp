// Config JSON (model and training fields): parse, resolve, validate.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = jtok::fuzz::write_input(data, size, "config.json");
  jtok::fuzz::expect_clean([&] {
    jtok::Config c = jtok::load_config(path);
    (void)jtok::to_json(c).dump();
  });
  return 0;
}
