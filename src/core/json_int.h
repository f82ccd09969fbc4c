// Integer fields of JSON files and requests, read one way. nlohmann keeps a JSON integer as int64
// or uint64 and converts between them silently: get<int64_t>() turns 2^64 - 1 into -1, and
// get<uint64_t>() turns -1 into 2^64 - 1; a float past the target's range converts with undefined
// behaviour. These give the value only when the JSON holds exactly that integer, else nullopt, and
// the caller's error names the file, field and value (each parser has its own range and words).
//   json_int64(v):  a JSON integer in [-2^63, 2^63)
//   json_uint64(v): a JSON integer in [0, 2^64)
// With integral_floats, a float with an integral value within +-2^53 counts too (clients send
// 16.0); past 2^53 a double no longer holds every integer, so 1e17 might not be what was written.
#pragma once
#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

namespace jtok {

std::optional<int64_t> json_int64(const nlohmann::json& v, bool integral_floats = false);
std::optional<uint64_t> json_uint64(const nlohmann::json& v, bool integral_floats = false);

}  // namespace jtok
