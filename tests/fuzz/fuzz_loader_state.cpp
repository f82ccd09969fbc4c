// trainer_state.json's data loader state (what --resume restores), and the JSON around it.
#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  jtok::fuzz::expect_clean([&] {
    jtok::LoaderState s = jtok::loader_state_from_json(j.is_object() && j.contains("data") ? j["data"] : j);
    if (!(jtok::loader_state_from_json(jtok::to_json(s)) == s)) std::abort();  // round trip
  });
  return 0;
}
