#include "ops/q8_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// GCC 12's AVX-512 headers trip its own -Wmaybe-uninitialized (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define JTOK_Q8_VNNI 1
#endif

#include "core/error.h"
#include "ops/q8_gemm_avx2.h"

namespace jtok {

bool q8_gemm_vnni() {
#if defined(JTOK_Q8_VNNI)
  return true;
#else
  return false;
#endif
}

const char* q8_kernels_name(Q8Kernels k) {
  switch (k) {
    case Q8Kernels::vnni: return "vnni";
    case Q8Kernels::avx2: return "avx2";
    case Q8Kernels::fallback: return "fallback";
  }
  return "?";
}

// From the CPU's flags, never timed: a host always runs the same kernels (the same bits).
bool q8_kernels_available(Q8Kernels k) {
  switch (k) {
    case Q8Kernels::vnni: return q8_gemm_vnni() && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
    case Q8Kernels::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Q8Kernels::fallback: return true;
  }
  return false;
}

namespace {

std::atomic<int> g_kernels{-1};  // the Q8Kernels in use; -1 until first asked

Q8Kernels default_kernels() {
  const char* e = std::getenv("JTOK_LOWP_KERNELS");
  if (e != nullptr && *e != '\0') return parse_q8_kernels(e, "JTOK_LOWP_KERNELS");
  for (Q8Kernels k : {Q8Kernels::vnni, Q8Kernels::avx2})
    if (q8_kernels_available(k)) return k;
  return Q8Kernels::fallback;
}

}  // namespace

Q8Kernels q8_kernels() {
  int k = g_kernels.load(std::memory_order_relaxed);
  if (k < 0) {  // callers racing here compute the same value
    k = static_cast<int>(default_kernels());
    g_kernels.store(k, std::memory_order_relaxed);
  }
  return static_cast<Q8Kernels>(k);
}

Q8Kernels parse_q8_kernels(const char* value, const char* what) {
  for (Q8Kernels k : {Q8Kernels::vnni, Q8Kernels::avx2, Q8Kernels::fallback})
    if (std::string(value) == q8_kernels_name(k)) {
      JTOK_CHECK(q8_kernels_available(k), what, "=", value, ": this CPU or build has no ",
                 k == Q8Kernels::vnni ? "AVX-512 VNNI" : "AVX2 + FMA", " (fallback runs anywhere)");
      return k;
    }
  fail(what, "=", value, ": not one of vnni, avx2, fallback");
}

void set_q8_kernels(Q8Kernels k) {
  JTOK_CHECK(q8_kernels_available(k), "set_q8_kernels: the ", q8_kernels_name(k), " kernels need ",
             k == Q8Kernels::vnni ? "AVX-512 VNNI" : "AVX2 + FMA", ", which this CPU or build lacks");
  g_kernels.store(static_cast<int>(k), std::memory_order_relaxed);
}

namespace {

constexpr int64_t kBlk = kActBlock;  // 32 columns: one input scale

// inp (N, C) quantised per block of 32 (quantize_act_q8) into xq (N, Cp) bytes (the padding past C
// 0), scales into xs (N, nb). With offset, each byte is q + 128 (the unsigned operand of vpdpbusd;
// the padding then holds 128, i.e. 0).
void quantize_input(uint8_t* xq, float* xs, const float* inp, int64_t N, int64_t C, int64_t Cp, int64_t nb,
                    bool offset) {
#pragma omp parallel for schedule(static) if (N * C >= (1 << 16))
  for (int64_t n = 0; n < N; ++n) {
    int8_t* q = reinterpret_cast<int8_t*>(xq + n * Cp);
    quantize_act_q8(q, xs + n * nb, inp + n * C, C);
    std::memset(q + C, 0, static_cast<size_t>(Cp - C));
    if (!offset) continue;
    uint8_t* u = xq + n * Cp;
#pragma omp simd
    for (int64_t c = 0; c < Cp; ++c) u[c] ^= 0x80;  // two's complement q -> q + 128
  }
}

// The plain product on the quantised input (xq signed): per (row, output) the blocks' exact int32
// sums, each times its input scale, summed in block order, times the weight row's scale.
void q8_gemm_plain(float* out, const int8_t* xq, const float* xs, const WeightMatrix& w, int64_t N, int64_t Cp,
                   int64_t nb, bool acc) {
  const int64_t OC = w.rows, C = w.cols;
  const int8_t* W = static_cast<const int8_t*>(w.data);
#pragma omp parallel for schedule(static) if (N * OC * C >= (1 << 18))
  for (int64_t o = 0; o < OC; ++o)
    for (int64_t n = 0; n < N; ++n) {
      float sum = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t isum = 0;
        for (int64_t c = b * kBlk; c < std::min(C, (b + 1) * kBlk); ++c)
          isum += static_cast<int32_t>(xq[n * Cp + c]) * W[o * C + c];
        sum += static_cast<float>(isum) * xs[n * nb + b];
      }
      float& y = out[n * OC + o];
      y = (acc ? y : 0.0f) + sum * w.scale[o];
    }
}

#if defined(JTOK_Q8_VNNI)
#ifndef JTOK_Q8_NJ  // only for a sweep: 2 x 6 (measured best), 3 x 4 and 4 x 3 fill the registers alike
#define JTOK_Q8_NJ 2
#define JTOK_Q8_MR 6
#endif
constexpr int kNJ = JTOK_Q8_NJ;        // vectors of 16 output rows per tile
constexpr int64_t kNR = 16 * kNJ;      // output rows per panel
constexpr int kMR = JTOK_Q8_MR;        // input rows per tile: 12 int32 + 12 fp32 accumulators
constexpr int64_t kSteps = kBlk / 4;   // vpdpbusd steps (4 columns each) per block
constexpr int64_t kBlockBytes = kNJ * 64 + kSteps * kNJ * 64;  // per block: start sums, then the steps

// 16 rows of 64 bytes (row stride ld) to v[k] = the 16 rows' bytes 4k..4k+3 (lane i: row i): a
// 16 x 16 transpose of 4-byte words in three rounds (words, pairs of words, 128-bit lanes).
inline void transpose16(__m512i* v, const int8_t* src, int64_t ld) {
  __m512i r[16], t[16], u[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * ld);
  for (int m = 0; m < 8; ++m) {
    t[2 * m] = _mm512_unpacklo_epi32(r[2 * m], r[2 * m + 1]);
    t[2 * m + 1] = _mm512_unpackhi_epi32(r[2 * m], r[2 * m + 1]);
  }
  for (int m = 0; m < 4; ++m) {  // u[4m + q], 128-bit lane L: rows 4m..4m+3 of word 4L + q
    u[4 * m] = _mm512_unpacklo_epi64(t[4 * m], t[4 * m + 2]);
    u[4 * m + 1] = _mm512_unpackhi_epi64(t[4 * m], t[4 * m + 2]);
    u[4 * m + 2] = _mm512_unpacklo_epi64(t[4 * m + 1], t[4 * m + 3]);
    u[4 * m + 3] = _mm512_unpackhi_epi64(t[4 * m + 1], t[4 * m + 3]);
  }
  for (int q = 0; q < 4; ++q) {
    const __m512i w0 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x88), w1 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xdd);
    const __m512i w2 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x88), w3 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xdd);
    v[q] = _mm512_shuffle_i32x4(w0, w2, 0x88);
    v[8 + q] = _mm512_shuffle_i32x4(w0, w2, 0xdd);
    v[4 + q] = _mm512_shuffle_i32x4(w1, w3, 0x88);
    v[12 + q] = _mm512_shuffle_i32x4(w1, w3, 0xdd);
  }
}

// Weight rows [o0, o0 + kNR) of w packed for the tile (zeros past OC and C), per block of 32 columns:
// kNJ vectors of int32 start sums, -128 * the sum of the block's weights of each row (taking back
// the +128 of the input), then for each step of 4 columns kNJ vectors of 16 rows x 4 bytes.
void pack_panel(int8_t* dst, const WeightMatrix& w, int64_t o0, int64_t nb) {
  const int64_t OC = w.rows, C = w.cols;
  const int8_t* W = static_cast<const int8_t*>(w.data);
  const __m512i zero = _mm512_setzero_si512(), ones = _mm512_set1_epi8(1);
  if (o0 + kNR <= OC && C % 64 == 0) {  // whole panel: 16 rows x 64 columns at a time, transposed
    for (int j = 0; j < kNJ; ++j) {
      const int8_t* src = W + (o0 + 16 * j) * C;
      for (int64_t c = 0; c < C; c += 64) {
        __m512i v[16];
        transpose16(v, src + c, C);
        for (int h = 0; h < 2; ++h) {  // the two blocks of the 64 columns
          int8_t* blk = dst + (c / kBlk + h) * kBlockBytes;
          __m512i s = zero;
          for (int64_t st = 0; st < kSteps; ++st) {
            _mm512_store_si512(blk + (kNJ + st * kNJ + j) * 64, v[h * kSteps + st]);
            s = _mm512_dpbusd_epi32(s, ones, v[h * kSteps + st]);  // each row's sum of the 4 bytes
          }
          _mm512_store_si512(blk + j * 64, _mm512_sub_epi32(zero, _mm512_slli_epi32(s, 7)));
        }
      }
    }
    return;
  }
  for (int64_t b = 0; b < nb; ++b) {  // the last panel, or C not a multiple of 64
    int8_t* blk = dst + b * kBlockBytes;
    for (int64_t r = 0; r < kNR; ++r) {
      const int64_t o = o0 + r;
      int32_t s = 0;
      for (int64_t st = 0; st < kSteps; ++st)
        for (int64_t t = 0; t < 4; ++t) {
          const int64_t c = b * kBlk + 4 * st + t;
          const int8_t v = o < OC && c < C ? W[o * C + c] : 0;
          blk[(kNJ + st * kNJ) * 64 + r * 4 + t] = v;  // vector r / 16 of the step, lane r % 16
          s += v;
        }
      const int32_t start = -128 * s;
      std::memcpy(blk + r * 4, &start, 4);
    }
  }
}

// MR input rows (xu, row stride ldx; scales xs, row stride nb) against one packed panel; out
// (row stride ldo) (+)= the products of its first nv (<= kNR) output rows, times their scales ws.
template <int MR>
inline void tile(float* out, int64_t ldo, const uint8_t* xu, int64_t ldx, const float* xs, int64_t nb,
                 const int8_t* panel, const float* ws, int64_t nv, bool acc) {
  __m512 f[MR][kNJ];
  __m512i s[MR][kNJ];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kNJ; ++j) f[i][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* blk = panel + b * kBlockBytes;
#pragma GCC unroll 8
    for (int j = 0; j < kNJ; ++j) {
      const __m512i start = _mm512_load_si512(blk + j * 64);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) s[i][j] = start;
    }
    const int8_t* wp = blk + kNJ * 64;
    const uint8_t* xb = xu + b * kBlk;
    for (int64_t st = 0; st < kSteps; ++st) {
      __m512i wv[kNJ];
#pragma GCC unroll 8
      for (int j = 0; j < kNJ; ++j) wv[j] = _mm512_load_si512(wp + (st * kNJ + j) * 64);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        int32_t x4;
        std::memcpy(&x4, xb + i * ldx + 4 * st, 4);
        const __m512i xv = _mm512_set1_epi32(x4);
#pragma GCC unroll 8
        for (int j = 0; j < kNJ; ++j) s[i][j] = _mm512_dpbusd_epi32(s[i][j], xv, wv[j]);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 sc = _mm512_set1_ps(xs[i * nb + b]);
#pragma GCC unroll 8
      for (int j = 0; j < kNJ; ++j) f[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i][j]), sc, f[i][j]);
    }
  }
  for (int j = 0; j < kNJ; ++j) {
    const int64_t left = nv - 16 * j;
    if (left <= 0) break;
    const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
    const __m512 wsv = _mm512_maskz_loadu_ps(m, ws + 16 * j);
    for (int i = 0; i < MR; ++i) {
      float* o = out + i * ldo + 16 * j;
      // f * ws, or out + f * ws with one rounding (what GCC made of a multiply and an add anyway).
      const __m512 v = acc ? _mm512_fmadd_ps(f[i][j], wsv, _mm512_maskz_loadu_ps(m, o)) : _mm512_mul_ps(f[i][j], wsv);
      _mm512_mask_storeu_ps(o, m, v);
    }
  }
}

// The last left (< kMR) input rows: one tile of exactly that many.
template <int MR>
inline void tile_rest(float* out, int64_t ldo, const uint8_t* xu, int64_t ldx, const float* xs, int64_t nb,
                      const int8_t* panel, const float* ws, int64_t nv, bool acc, int64_t left) {
  if constexpr (MR > 0) {
    if (left == MR) tile<MR>(out, ldo, xu, ldx, xs, nb, panel, ws, nv, acc);
    else tile_rest<MR - 1>(out, ldo, xu, ldx, xs, nb, panel, ws, nv, acc, left);
  }
}

void q8_gemm_vnni_tiles(float* out, const uint8_t* xu, const float* xs, const WeightMatrix& w, int64_t N, int64_t Cp,
                        int64_t nb, bool acc) {
  const int64_t OC = w.rows, npanels = (OC + kNR - 1) / kNR;
#pragma omp parallel if (N * OC * Cp >= (1 << 18))
  {
    std::vector<int8_t> buf(static_cast<size_t>(nb * kBlockBytes + 64));
    int8_t* panel = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < npanels; ++p) {
      const int64_t o0 = p * kNR, nv = std::min(kNR, OC - o0);
      pack_panel(panel, w, o0, nb);
      const float* ws = w.scale + o0;
      int64_t n = 0;
      for (; n + kMR <= N; n += kMR)
        tile<kMR>(out + n * OC + o0, OC, xu + n * Cp, Cp, xs + n * nb, nb, panel, ws, nv, acc);
      tile_rest<kMR - 1>(out + n * OC + o0, OC, xu + n * Cp, Cp, xs + n * nb, nb, panel, ws, nv, acc, N - n);
    }
  }
}
#endif

}  // namespace

void q8_gemm(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate) {
  q8_gemm(out, inp, w, N, accumulate, q8_kernels());
}

void q8_gemm(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate, Q8Kernels k) {
  JTOK_CHECK(w.dtype == Dtype::int8 && w.scale != nullptr, "q8_gemm: int8 weights with scales only");
  JTOK_CHECK(q8_kernels_available(k), "q8_gemm: the ", q8_kernels_name(k), " kernels are not available here");
  if (N <= 0) return;
  const int64_t C = w.cols, nb = (C + kBlk - 1) / kBlk, Cp = nb * kBlk;
  thread_local std::vector<uint8_t> xq;
  thread_local std::vector<float> xs;
  xq.resize(static_cast<size_t>(N * Cp));
  xs.resize(static_cast<size_t>(N * nb));
  quantize_input(xq.data(), xs.data(), inp, N, C, Cp, nb, k == Q8Kernels::vnni);
  const int8_t* xq8 = reinterpret_cast<const int8_t*>(xq.data());
  switch (k) {
    case Q8Kernels::vnni:
#if defined(JTOK_Q8_VNNI)
      q8_gemm_vnni_tiles(out, xq.data(), xs.data(), w, N, Cp, nb, accumulate);
#endif
      break;
    case Q8Kernels::avx2: q8_gemm_avx2_tiles(out, xq8, xs.data(), w, N, Cp, nb, accumulate); break;
    case Q8Kernels::fallback: q8_gemm_plain(out, xq8, xs.data(), w, N, Cp, nb, accumulate); break;
  }
}

}  // namespace jtok
