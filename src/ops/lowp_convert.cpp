#include "ops/lowp_convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX512F__)
// GCC 12's AVX-512 headers trip its own -Wmaybe-uninitialized (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#endif

#include "core/error.h"

namespace jtok {

uint16_t f32_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

void quantize_bf16_row(uint16_t* d, const float* s, int64_t n) {
  int64_t c = 0;
#if defined(__AVX512BF16__)
  for (; c + 32 <= n; c += 32) {  // vcvtne2ps2bf16: round to nearest even, as f32_to_bf16
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + c + 16), _mm512_loadu_ps(s + c));
    _mm512_storeu_si512(d + c, reinterpret_cast<const __m512i&>(v));
  }
#endif
  for (; c < n; ++c) d[c] = f32_to_bf16(s[c]);
}

void quantize_bf16_rows(uint16_t* dst, const float* src, int64_t rows, int64_t cols, int64_t ld) {
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) quantize_bf16_row(dst + r * cols, src + r * ld, cols);
}

void quantize_bf16(uint16_t* out, const float* in, int64_t n) {
  constexpr int64_t kBlock = 1 << 14;  // blocks as rows: the strided path's threads and vector loop
  const int64_t full = n / kBlock;
  quantize_bf16_rows(out, in, full, kBlock, kBlock);
  quantize_bf16_rows(out + full * kBlock, in + full * kBlock, 1, n - full * kBlock, n - full * kBlock);
}

bool all_finite(const float* x, int64_t n) {
  bool finite = true;
  for (int64_t c = 0; c < n; ++c) finite = finite && std::isfinite(x[c]);
  return finite;
}

float quantize_int8_span(int8_t* q, const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t c = 0; c < n; ++c) amax = std::max(amax, std::fabs(x[c]));
  const float s = amax / 127.0f;
  // A division, not a multiply by 1/s: the value nearest x / s exactly (token tables rely on it).
  for (int64_t c = 0; c < n; ++c) q[c] = s > 0 ? static_cast<int8_t>(std::clamp(std::nearbyint(x[c] / s), -127.0f, 127.0f)) : 0;
  return s;
}

void quantize_int8_rows(int8_t* q, float* scale, const float* W, int64_t rows, int64_t cols) {
  int64_t bad_row = -1;  // an exception must not leave an OpenMP region: the check is after it
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 20))
  for (int64_t o = 0; o < rows; ++o) {
    const float* w = W + o * cols;
    if (!all_finite(w, cols)) {
#pragma omp atomic write
      bad_row = o;
    }
    scale[o] = quantize_int8_span(q + o * cols, w, cols);
  }
  JTOK_CHECK(bad_row < 0, "quantize_int8_rows: row ", bad_row, " holds a non-finite value");
}

// One row of w as fp32.
static inline void dequantize_row(float* out, const WeightMatrix& w, int64_t o) {
  const int64_t C = w.cols;
  switch (w.dtype) {
    case Dtype::f32:
      std::memcpy(out, static_cast<const float*>(w.data) + o * C, sizeof(float) * C);
      break;
    case Dtype::bf16: {
      const uint16_t* b = static_cast<const uint16_t*>(w.data) + o * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const uint32_t u = static_cast<uint32_t>(b[c]) << 16;
        float x;
        std::memcpy(&x, &u, 4);
        out[c] = x;
      }
      break;
    }
    case Dtype::int8: {
      const int8_t* q = static_cast<const int8_t*>(w.data) + o * C;
      const float s = w.scale[o];
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) out[c] = static_cast<float>(q[c]) * s;
      break;
    }
    case Dtype::int4:  // token tables only: parse_dtype never lets --weight-dtype take it
      fail("dequantize_rows: int4 weights are not a format");
  }
}

void dequantize_rows(float* out, const WeightMatrix& w, int64_t r0, int64_t r1) {
  for (int64_t o = r0; o < r1; ++o) dequantize_row(out + (o - r0) * w.cols, w, o);
}

void quantize_act_q8(int8_t* q, float* scale, const float* x, int64_t n) {
  int64_t b = 0;
  for (int64_t c = 0; c < n; c += kActBlock, ++b) {
    const int64_t len = std::min(kActBlock, n - c);
#if defined(__AVX512F__)
    if (len == kActBlock) {  // the same operations as quantize_int8_span, 16 lanes at a time: the same bits
      const __m512 v0 = _mm512_loadu_ps(x + c), v1 = _mm512_loadu_ps(x + c + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float s = amax / 127.0f;
      scale[b] = s;
      if (!(s > 0)) {
        std::memset(q + c, 0, kActBlock);
        continue;
      }
      const __m512 sv = _mm512_set1_ps(s), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
      // vcvtps2dq rounds to nearest even, as nearbyint in the default rounding mode.
      const __m512i i0 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_div_ps(v0, sv), lo), hi));
      const __m512i i1 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_div_ps(v1, sv), lo), hi));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + c), _mm512_cvtepi32_epi8(i0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + c + 16), _mm512_cvtepi32_epi8(i1));
      continue;
    }
#endif
    scale[b] = quantize_int8_span(q + c, x + c, len);
  }
}

}  // namespace jtok
