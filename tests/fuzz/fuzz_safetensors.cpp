// safetensors: header, tensor table, bounds; then every tensor read.
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = jtok::fuzz::write_input(data, size, "x.safetensors");
  jtok::fuzz::expect_clean([&] {
    jtok::StFile f = jtok::read_safetensors(path);
    for (auto& [name, t] : f.tensors)
      if (t.dtype == "F32") (void)t.as_f32();
  });
  return 0;
}
