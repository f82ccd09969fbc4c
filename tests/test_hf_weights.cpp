// hf/hf_weights: every bf16 and f16 value converts to f32 exactly (against the CPU's own f16
// conversion and bf16's definition as f32's upper half), and a tensor streamed in chunks that do
// not divide it arrives whole and in order; hf/hf_config: the pad multiple that leaves a vocabulary
// unpadded.
#include <gtest/gtest.h>
#include <immintrin.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "hf/hf_config.h"
#include "hf/hf_weights.h"
#include "io/safetensors.h"

namespace jtok {
namespace {

namespace fs = std::filesystem;

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

TEST(HfWeights, EveryBf16ValueConvertsExactly) {
  std::vector<uint16_t> h(65536);
  for (uint32_t i = 0; i < 65536; ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> f(h.size());
  bf16_to_f32_n(h.data(), f.data(), static_cast<int64_t>(h.size()));
  for (uint32_t i = 0; i < 65536; ++i) ASSERT_EQ(bits(f[i]), i << 16) << "bf16 0x" << std::hex << i;
}

TEST(HfWeights, EveryF16ValueConvertsExactly) {
  std::vector<uint16_t> h(65536);
  for (uint32_t i = 0; i < 65536; ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> f(h.size());
  f16_to_f32_n(h.data(), f.data(), static_cast<int64_t>(h.size()));
  int nans = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const float want = _cvtsh_ss(static_cast<unsigned short>(i));  // F16C: the hardware's exact conversion
    if (want != want) {  // NaN: any NaN of the same sign will do
      ASSERT_TRUE(f[i] != f[i]) << "f16 0x" << std::hex << i;
      ASSERT_EQ(bits(f[i]) >> 31, bits(want) >> 31);
      ++nans;
      continue;
    }
    ASSERT_EQ(bits(f[i]), bits(want)) << "f16 0x" << std::hex << i;  // subnormals, +-0, +-inf included
  }
  EXPECT_EQ(nans, 2 * 1023);
}

TEST(HfWeights, StreamedInChunksThatDoNotDivideTheTensor) {
  const fs::path dir = fs::temp_directory_path() / ("jtok_test_hf_weights_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<uint16_t> raw(1000);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint16_t>(0x3f80 + i);  // 1.0 and up, as bf16
  StFile f;
  f.tensors["w"] = StTensor{"BF16", {10, 100}, std::string(reinterpret_cast<const char*>(raw.data()), raw.size() * 2)};
  write_safetensors((dir / "model.safetensors").string(), f);
  const HfWeights w = open_hf_weights(dir.string());
  std::vector<float> got;
  int calls = 0;
  stream_tensor_f32(w, "w", [&](const float* v, int64_t n) {
    EXPECT_LE(n, 333);
    got.insert(got.end(), v, v + n);
    ++calls;
  }, /*chunk=*/333);
  EXPECT_EQ(calls, 4);  // 333 + 333 + 333 + 1
  ASSERT_EQ(got.size(), raw.size());
  for (size_t i = 0; i < raw.size(); ++i) ASSERT_EQ(bits(got[i]), static_cast<uint32_t>(raw[i]) << 16) << i;
  fs::remove_all(dir);
}

TEST(HfConfig, PadMultipleLeavesTheVocabularyUnpadded) {
  for (int64_t v : {151936, 128256, 300, 268, 50257, 1, 64, 96}) {
    const int64_t m = pad_multiple_for(v);
    EXPECT_EQ((v + m - 1) / m * m, v) << v;
  }
  EXPECT_EQ(pad_multiple_for(151936), 64);
  EXPECT_EQ(pad_multiple_for(300), 4);
  EXPECT_EQ(pad_multiple_for(50257), 1);
}

}  // namespace
}  // namespace jtok
