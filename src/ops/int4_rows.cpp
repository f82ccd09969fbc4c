#include "ops/int4_rows.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/lowp_convert.h"

namespace jtok {

namespace {
int lo_nibble(uint8_t b) { return static_cast<int8_t>(static_cast<uint8_t>(b << 4)) >> 4; }  // arithmetic shift: sign-extends
int hi_nibble(uint8_t b) { return static_cast<int8_t>(b) >> 4; }
}  // namespace

float quantize_int4_row(uint8_t* q, const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float s = amax / static_cast<float>(kInt4Max);
  std::fill(q, q + (n + 1) / 2, uint8_t{0});
  if (!(s > 0)) return s;
  for (int64_t j = 0; j < n; ++j) {
    // A division, as the int8 rows: the level nearest x / s exactly.
    const int v = static_cast<int>(std::clamp(std::nearbyint(x[j] / s), -float(kInt4Max), float(kInt4Max)));
    q[j / 2] |= static_cast<uint8_t>((static_cast<unsigned>(v) & 0xfu) << (j % 2 ? 4 : 0));
  }
  return s;
}

void quantize_int4_rows(uint8_t* q, float* scale, const float* x, int64_t rows, int64_t cols) {
  const int64_t stride = (cols + 1) / 2;
  int64_t bad_row = -1;  // an exception must not leave an OpenMP region: the check is after it
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 20))
  for (int64_t r = 0; r < rows; ++r) {
    const float* w = x + r * cols;
    if (!all_finite(w, cols)) {
#pragma omp critical(int4_bad_row)
      bad_row = bad_row < 0 ? r : std::min(bad_row, r);
    }
    scale[r] = quantize_int4_row(q + r * stride, w, cols);
  }
  JTOK_CHECK(bad_row < 0, "quantize_int4_rows: row ", bad_row, " holds a non-finite value");
}

float int4_element(const uint8_t* q, float scale, int64_t j) {
  const uint8_t b = q[j / 2];
  return static_cast<float>(j % 2 ? hi_nibble(b) : lo_nibble(b)) * scale;
}

void dequantize_int4_row(float* out, const uint8_t* q, float scale, int64_t n) {
  const int64_t pairs = n / 2;
#pragma omp simd
  for (int64_t i = 0; i < pairs; ++i) {
    const uint8_t b = q[i];
    out[2 * i] = static_cast<float>(lo_nibble(b)) * scale;
    out[2 * i + 1] = static_cast<float>(hi_nibble(b)) * scale;
  }
  if (n % 2) out[n - 1] = static_cast<float>(lo_nibble(q[pairs])) * scale;
}

}  // namespace jtok
