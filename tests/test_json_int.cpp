// core/json_int: the one reader of JSON integer fields. Each case is a JSON text as a file or a
// request would hold it, so the int64 / uint64 / float storage nlohmann picks is the real one.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>

#include "core/json_int.h"

namespace jtok {
namespace {

std::optional<int64_t> i64(const char* text, bool floats = false) { return json_int64(nlohmann::json::parse(text), floats); }
std::optional<uint64_t> u64(const char* text, bool floats = false) { return json_uint64(nlohmann::json::parse(text), floats); }

TEST(JsonInt, Int64TakesExactlyTheSignedRange) {
  EXPECT_EQ(i64("0"), 0);
  EXPECT_EQ(i64("-5"), -5);
  EXPECT_EQ(i64("9223372036854775807"), INT64_MAX);   // stored unsigned by nlohmann
  EXPECT_EQ(i64("-9223372036854775808"), INT64_MIN);
  EXPECT_EQ(i64("9223372036854775808"), std::nullopt);  // 2^63: get<int64_t> would give INT64_MIN
  EXPECT_EQ(i64("18446744073709551615"), std::nullopt);  // 2^64 - 1: get<int64_t> would give -1
}

TEST(JsonInt, Uint64TakesExactlyTheUnsignedRange) {
  EXPECT_EQ(u64("0"), 0u);
  EXPECT_EQ(u64("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(u64("-1"), std::nullopt);  // get<uint64_t> would give 2^64 - 1
  EXPECT_EQ(u64("-9223372036854775808"), std::nullopt);
}

TEST(JsonInt, FloatsOnlyWhenAskedAndIntegralWithin2To53) {
  for (const char* f : {"16.0", "1e3", "-2.0", "0.0"}) {
    EXPECT_EQ(i64(f), std::nullopt) << f;  // files: integers only
    EXPECT_EQ(u64(f), std::nullopt) << f;
  }
  EXPECT_EQ(i64("16.0", true), 16);
  EXPECT_EQ(i64("1e3", true), 1000);
  EXPECT_EQ(i64("-2.0", true), -2);
  EXPECT_EQ(u64("16.0", true), 16u);
  EXPECT_EQ(u64("-2.0", true), std::nullopt);
  EXPECT_EQ(i64("9007199254740992.0", true), 9007199254740992LL);  // 2^53
  EXPECT_EQ(u64("9007199254740992.0", true), 9007199254740992ULL);
  for (const char* f : {"9007199254740994.0", "-9007199254740994.0", "1e17", "1e300", "-1e300", "0.5", "-2.5",
                        "5.55556e+101"}) {
    EXPECT_EQ(i64(f, true), std::nullopt) << f;
    EXPECT_EQ(u64(f, true), std::nullopt) << f;
  }
}

TEST(JsonInt, NonNumbersAreNeverIntegers) {
  for (const char* t : {"\"7\"", "true", "null", "[1]", "{\"a\": 1}"}) {
    EXPECT_EQ(i64(t, true), std::nullopt) << t;
    EXPECT_EQ(u64(t, true), std::nullopt) << t;
  }
}

}  // namespace
}  // namespace jtok
