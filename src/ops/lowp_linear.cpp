#include "ops/lowp_linear.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
// GCC 12's AVX-512 headers trip its own -Wmaybe-uninitialized (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#endif

#include "core/error.h"
#include "ops/linear.h"

namespace jtok {

const char* weight_dtype_name(WeightDType t) {
  switch (t) {
    case WeightDType::f32: return "f32";
    case WeightDType::bf16: return "bf16";
    case WeightDType::int8: return "int8";
  }
  return "?";
}

WeightDType parse_weight_dtype(const std::string& s) {
  if (s == "f32") return WeightDType::f32;
  if (s == "bf16") return WeightDType::bf16;
  if (s == "int8") return WeightDType::int8;
  fail("unknown weight dtype '", s, "' (expected f32, bf16 or int8)");
}

int64_t weight_dtype_bytes(WeightDType t) { return t == WeightDType::f32 ? 4 : t == WeightDType::bf16 ? 2 : 1; }

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

void quantize_bf16_rows(uint16_t* dst, const float* src, int64_t rows, int64_t cols, int64_t ld) {
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * ld;
    uint16_t* d = dst + r * cols;
    int64_t c = 0;
#if defined(__AVX512BF16__)
    for (; c + 32 <= cols; c += 32) {  // vcvtne2ps2bf16: round to nearest even, as f32_to_bf16
      const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + c + 16), _mm512_loadu_ps(s + c));
      _mm512_storeu_si512(d + c, reinterpret_cast<const __m512i&>(v));
    }
#endif
    for (; c < cols; ++c) d[c] = f32_to_bf16(s[c]);
  }
}

void quantize_bf16(uint16_t* out, const float* in, int64_t n) {
  constexpr int64_t kBlock = 1 << 14;  // blocks as rows: the strided path's threads and vector loop
  const int64_t full = n / kBlock;
  quantize_bf16_rows(out, in, full, kBlock, kBlock);
  quantize_bf16_rows(out + full * kBlock, in + full * kBlock, 1, n - full * kBlock, n - full * kBlock);
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
    bool finite = true;
    for (int64_t c = 0; c < cols; ++c) finite = finite && std::isfinite(w[c]);
    if (!finite) {
#pragma omp atomic write
      bad_row = o;
    }
    scale[o] = quantize_int8_span(q + o * cols, w, cols);
  }
  JTOK_CHECK(bad_row < 0, "quantize_int8_rows: row ", bad_row, " holds a non-finite value");
}

// One row of w as fp32: the conversion every path below shares.
static inline void dequantize_row(float* out, const WeightMatrix& w, int64_t o) {
  const int64_t C = w.cols;
  switch (w.dtype) {
    case WeightDType::f32:
      std::memcpy(out, static_cast<const float*>(w.data) + o * C, sizeof(float) * C);
      break;
    case WeightDType::bf16: {
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
    case WeightDType::int8: {
      const int8_t* q = static_cast<const int8_t*>(w.data) + o * C;
      const float s = w.scale[o];
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) out[c] = static_cast<float>(q[c]) * s;
      break;
    }
  }
}

void dequantize_rows(float* out, const WeightMatrix& w, int64_t r0, int64_t r1) {
  for (int64_t o = r0; o < r1; ++o) dequantize_row(out + (o - r0) * w.cols, w, o);
}

static void check_shape(const WeightMatrix& w) {
  JTOK_CHECK(w.data != nullptr && w.rows > 0 && w.cols > 0, "linear_forward_lowp: unbound weight matrix");
  JTOK_CHECK(w.dtype != WeightDType::int8 || w.scale != nullptr, "linear_forward_lowp: int8 weights without scales");
}

void linear_forward_lowp_ref(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate) {
  check_shape(w);
  std::vector<float> W(static_cast<size_t>(w.rows * w.cols)), y(static_cast<size_t>(N * w.rows));
  dequantize_rows(W.data(), w, 0, w.rows);
  linear_forward_ref(y.data(), inp, W.data(), N, w.cols, w.rows);
  for (size_t i = 0; i < y.size(); ++i) out[i] = accumulate ? out[i] + y[i] : y[i];
}

// Dot products of nr (<= kRowBlock) consecutive fp32 weight rows (L1-resident) with one input row:
// the portable path, and the edges (last rows, C not a multiple of 16) of the AVX-512 one.
constexpr int64_t kRowBlock = 4;

static inline void dot_rows(float* out4, const float* x, const float* wb, int64_t C, int64_t nr) {
  for (int64_t r = 0; r < nr; ++r) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t c = 0; c < C; ++c) acc += x[c] * wb[r * C + c];
    out4[r] = acc;
  }
}

#if defined(__AVX512F__)
// 16 weights from p, converted to fp32 in registers (int8 without its scale).
template <WeightDType DT>
static inline __m512 load16(const void* p) {
  if constexpr (DT == WeightDType::int8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p))));
  } else {
    const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

static inline float hsum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0.0f;
  for (float x : t) s += x;
  return s;
}

// A register tile: kRowBlock weight rows (from o0) times MT input rows (from x, row stride C),
// weights converted once per 16 columns and used MT times. out[n * ldo + r] (+)= the dot product.
template <WeightDType DT, int MT>
static inline void tile_kernel(float* out, int64_t ldo, const float* x, const WeightMatrix& w, int64_t o0, bool acc) {
  using Elem = std::conditional_t<DT == WeightDType::int8, int8_t, uint16_t>;
  const int64_t C = w.cols;
  const Elem* row[kRowBlock];
  for (int r = 0; r < kRowBlock; ++r) row[r] = static_cast<const Elem*>(w.data) + (o0 + r) * C;
  __m512 a[kRowBlock][MT];
  for (auto& rr : a)
    for (auto& v : rr) v = _mm512_setzero_ps();
  for (int64_t c = 0; c < C; c += 16) {
    __m512 wv[kRowBlock];
    for (int r = 0; r < kRowBlock; ++r) wv[r] = load16<DT>(row[r] + c);
    for (int n = 0; n < MT; ++n) {
      const __m512 xv = _mm512_loadu_ps(x + n * C + c);
      for (int r = 0; r < kRowBlock; ++r) a[r][n] = _mm512_fmadd_ps(xv, wv[r], a[r][n]);
    }
  }
  for (int r = 0; r < kRowBlock; ++r) {
    const float s = DT == WeightDType::int8 ? w.scale[o0 + r] : 1.0f;
    for (int n = 0; n < MT; ++n) {
      float& o = out[n * ldo + r];
      o = (acc ? o : 0.0f) + hsum(a[r][n]) * s;
    }
  }
}

// All N input rows against one block of weight rows, four input rows at a time.
template <WeightDType DT>
static inline void block_kernel(float* out, int64_t OC, const float* inp, int64_t N, const WeightMatrix& w, int64_t o0,
                                bool acc) {
  const int64_t C = w.cols;
  int64_t n = 0;
  for (; n + 4 <= N; n += 4) tile_kernel<DT, 4>(out + n * OC + o0, OC, inp + n * C, w, o0, acc);
  switch (N - n) {
    case 3: tile_kernel<DT, 3>(out + n * OC + o0, OC, inp + n * C, w, o0, acc); break;
    case 2: tile_kernel<DT, 2>(out + n * OC + o0, OC, inp + n * C, w, o0, acc); break;
    case 1: tile_kernel<DT, 1>(out + n * OC + o0, OC, inp + n * C, w, o0, acc); break;
    default: break;
  }
}
#endif

// Few input rows: every thread walks its share of weight rows in blocks of kRowBlock; each block
// meets the input rows four at a time in registers.
static void gemv_lowp(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool acc) {
  const int64_t OC = w.rows, C = w.cols;
  const int64_t nblocks = (OC + kRowBlock - 1) / kRowBlock;
#pragma omp parallel if (OC * C >= (1 << 16))
  {
    std::vector<float> wb(static_cast<size_t>(kRowBlock * C));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t o0 = b * kRowBlock, nr = std::min(kRowBlock, OC - o0);
#if defined(__AVX512F__)
      if (nr == kRowBlock && C % 16 == 0) {
        if (w.dtype == WeightDType::int8) block_kernel<WeightDType::int8>(out, OC, inp, N, w, o0, acc);
        else block_kernel<WeightDType::bf16>(out, OC, inp, N, w, o0, acc);
        continue;
      }
#endif
      float r4[kRowBlock];
      dequantize_rows(wb.data(), w, o0, o0 + nr);
      for (int64_t n = 0; n < N; ++n) {
        dot_rows(r4, inp + n * C, wb.data(), C, nr);
        float* o = out + n * OC + o0;
        for (int64_t r = 0; r < nr; ++r) o[r] = acc ? o[r] + r4[r] : r4[r];
      }
    }
  }
}

// Many input rows: panels of weight rows converted to fp32, each multiplied by sgemm.
constexpr int64_t kPanelRows = 256;

static void gemm_lowp(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool acc) {
  const int64_t OC = w.rows, C = w.cols;
  std::vector<float> panel(static_cast<size_t>(std::min(kPanelRows, OC) * C));
  for (int64_t r0 = 0; r0 < OC; r0 += kPanelRows) {
    const int64_t r1 = std::min(OC, r0 + kPanelRows);
#pragma omp parallel for schedule(static)
    for (int64_t o = r0; o < r1; ++o) dequantize_row(panel.data() + (o - r0) * C, w, o);
    gemm(false, true, N, r1 - r0, C, 1.0f, inp, C, panel.data(), C, acc ? 1.0f : 0.0f, out + r0, OC);
  }
}

void linear_forward_lowp(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate) {
  check_shape(w);
  if (N <= 0) return;
  if (w.dtype == WeightDType::f32)
    gemm(false, true, N, w.rows, w.cols, 1.0f, inp, w.cols, static_cast<const float*>(w.data), w.cols,
         accumulate ? 1.0f : 0.0f, out, w.rows);
  else if (N <= kLowpGemvRows)
    gemv_lowp(out, inp, w, N, accumulate);
  else
    gemm_lowp(out, inp, w, N, accumulate);
}

}  // namespace jtok
