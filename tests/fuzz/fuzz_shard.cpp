// Token shards: header, size, checksum; then every token read.
#include "data/shard.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = jtok::fuzz::write_input(data, size, "x.bin");
  jtok::fuzz::expect_clean([&] {
    jtok::Shard s(path);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < s.size(); ++i) sum += s.token(i);
    (void)sum;
  });
  return 0;
}
