#include "core/json_int.h"

#include <cmath>
#include <limits>

namespace jtok {

namespace {

// An integral float within +-2^53, as an int64; nullopt for fractions, NaN, infinities and larger.
std::optional<int64_t> integral_float(const nlohmann::json& v) {
  const double d = v.get<double>();
  constexpr double kExact = 9007199254740992.0;  // 2^53
  if (!(std::fabs(d) <= kExact) || d != std::trunc(d)) return std::nullopt;
  return static_cast<int64_t>(d);
}

}  // namespace

std::optional<int64_t> json_int64(const nlohmann::json& v, bool integral_floats) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (integral_floats && v.is_number_float()) return integral_float(v);
  return std::nullopt;
}

std::optional<uint64_t> json_uint64(const nlohmann::json& v, bool integral_floats) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0) return std::nullopt;
    return static_cast<uint64_t>(i);
  }
  if (integral_floats && v.is_number_float()) {
    const auto i = integral_float(v);
    if (!i || *i < 0) return std::nullopt;
    return static_cast<uint64_t>(*i);
  }
  return std::nullopt;
}

}  // namespace jtok
