// A branch-free expf that GCC vectorizes inside `omp simd` loops (glibc's vector expf needs
// -ffast-math, which we avoid). exp(x) = 2^n * exp(r), n = round(x / ln2), |r| <= ln2/2, exp(r) by
// its degree-7 Taylor polynomial: relative error ~1e-7, the same as expf's rounding.
#pragma once
#include <cstdint>
#include <cstring>

namespace jtok {

#pragma omp declare simd notinbranch
inline float fast_expf(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // Round to nearest by adding and subtracting 1.5 * 2^23 (pure arithmetic, so it vectorizes;
  // roundf would be a scalar library call).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;  // ln2 split in hi + lo
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace jtok
