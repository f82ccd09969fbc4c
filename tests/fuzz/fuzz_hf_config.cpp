// A Hugging Face config.json: parse, map to a jtok ModelConfig (refusals), map back to HF's fields.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "hf/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;  // not JSON: the importer's read_json refuses it before mapping
  jtok::fuzz::expect_clean([&] {
    const jtok::HfModelInfo info = jtok::model_config_from_hf(j, "config.json");
    (void)jtok::hf_config_from_model(info.model, "fuzz").dump();
  });
  return 0;
}
