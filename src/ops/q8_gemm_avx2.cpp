#include "ops/q8_gemm_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

// Every function that runs AVX2 / FMA instructions: compiled for them whatever the build's flags.
#define JTOK_AVX2_FN __attribute__((target("avx2,fma")))

namespace jtok {
namespace {

// Tile shapes tried (bench/lowp_linear_op, N 512 and 16, 1 thread, on the Zen 4 host running this
// AVX2 code, load ~10): 8 or 16 weight rows by 2, 3, 4 or 6 inputs all within the noise of each
// other (~59 G products/s at N 512, 768 x 768: the two multiply uops per 32 products, vpmaddubsw
// and vpmaddwd, bound it); 8 x 4 keeps every accumulator in a register.
#ifndef JTOK_Q8A_NJ  // only for a sweep
#define JTOK_Q8A_NJ 1
#define JTOK_Q8A_MR 4
#endif
constexpr int64_t kBlk = kActBlock;                 // 32 columns: one input scale
constexpr int kNJ = JTOK_Q8A_NJ;                    // vectors of 8 output rows per tile
constexpr int64_t kNR = 8 * kNJ;                    // output rows per panel
constexpr int kMR = JTOK_Q8A_MR;                    // input rows per tile
constexpr int64_t kSteps = kBlk / 4;                // steps of 4 columns (one int32 lane) per block
constexpr int64_t kBlockBytes = kSteps * kNJ * 32;  // a packed panel's bytes per block

// 8 rows of 32 bytes (row stride ld) to v[k] = the 8 rows' bytes 4k..4k+3 (lane i: row i): an 8 x 8
// transpose of 4-byte words in three rounds (words, pairs of words, 128-bit halves).
JTOK_AVX2_FN inline void transpose8(__m256i* v, const int8_t* src, int64_t ld) {
  __m256i r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * ld));
  for (int m = 0; m < 4; ++m) {  // half h of t[2m]: rows 2m, 2m+1 of words 4h, 4h+1 (t[2m+1]: 4h+2, 4h+3)
    t[2 * m] = _mm256_unpacklo_epi32(r[2 * m], r[2 * m + 1]);
    t[2 * m + 1] = _mm256_unpackhi_epi32(r[2 * m], r[2 * m + 1]);
  }
  for (int m = 0; m < 2; ++m) {  // half h of u[4m + q]: rows 4m..4m+3 of word 4h + q
    u[4 * m] = _mm256_unpacklo_epi64(t[4 * m], t[4 * m + 2]);
    u[4 * m + 1] = _mm256_unpackhi_epi64(t[4 * m], t[4 * m + 2]);
    u[4 * m + 2] = _mm256_unpacklo_epi64(t[4 * m + 1], t[4 * m + 3]);
    u[4 * m + 3] = _mm256_unpackhi_epi64(t[4 * m + 1], t[4 * m + 3]);
  }
  for (int q = 0; q < 4; ++q) {
    v[q] = _mm256_permute2x128_si256(u[q], u[4 + q], 0x20);
    v[4 + q] = _mm256_permute2x128_si256(u[q], u[4 + q], 0x31);
  }
}

// Weight rows [o0, o0 + kNR) of w packed for the tile (zeros past OC and C): per block of 32
// columns, per step of 4 columns, kNJ vectors of 8 rows x 4 bytes.
JTOK_AVX2_FN void pack_panel(int8_t* dst, const WeightMatrix& w, int64_t o0, int64_t nb) {
  const int64_t OC = w.rows, C = w.cols;
  const int8_t* W = static_cast<const int8_t*>(w.data);
  if (o0 + kNR <= OC && C % kBlk == 0) {  // whole panel: 8 rows x 32 columns at a time, transposed
    for (int j = 0; j < kNJ; ++j)
      for (int64_t b = 0; b < nb; ++b) {
        __m256i v[kSteps];
        transpose8(v, W + (o0 + 8 * j) * C + b * kBlk, C);
        for (int64_t st = 0; st < kSteps; ++st)
          _mm256_store_si256(reinterpret_cast<__m256i*>(dst + b * kBlockBytes + (st * kNJ + j) * 32), v[st]);
      }
    return;
  }
  for (int64_t b = 0; b < nb; ++b)  // the last panel, or C not a multiple of 32
    for (int64_t r = 0; r < kNR; ++r)
      for (int64_t st = 0; st < kSteps; ++st)
        for (int64_t t = 0; t < 4; ++t) {
          const int64_t o = o0 + r, c = b * kBlk + 4 * st + t;
          dst[b * kBlockBytes + (st * kNJ + r / 8) * 32 + (r % 8) * 4 + t] = o < OC && c < C ? W[o * C + c] : 0;
        }
}

// MR input rows (xq, row stride ldx; scales xs, row stride nb) against one packed panel; out (row
// stride ldo) (+)= the products of its first nv (<= kNR) output rows, times their scales ws.
// Per step the input's 4 bytes are broadcast, given each weight's sign (vpsignb: x, -x or 0) and
// multiplied by |w| (vpmaddubsw: unsigned x signed bytes, adjacent products summed into int16);
// vpmaddwd by ones sums those pairs into the int32 sums. A pair's sum is at most 2 x 128 x 127 =
// 32,512 in magnitude (x in [-127, 127] from quantize_act_q8; |w| <= 128, -128 included), below
// vpmaddubsw's saturation at 32,767: the int32 sums are exact, as vpdpbusd's.
template <int MR>
JTOK_AVX2_FN inline void tile(float* out, int64_t ldo, const int8_t* xq, int64_t ldx, const float* xs, int64_t nb,
                              const int8_t* panel, const float* ws, int64_t nv, bool acc) {
  __m256 f[MR][kNJ];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < kNJ; ++j) f[i][j] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* blk = panel + b * kBlockBytes;
    const int8_t* xb = xq + b * kBlk;
    __m256i s[MR][kNJ];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < kNJ; ++j) s[i][j] = _mm256_setzero_si256();
#pragma GCC unroll 1  // unrolled, GCC summed the steps' products in a tree and spilled them
    for (int64_t st = 0; st < kSteps; ++st) {
      __m256i wv[kNJ], aw[kNJ];
#pragma GCC unroll 8
      for (int j = 0; j < kNJ; ++j) {
        wv[j] = _mm256_load_si256(reinterpret_cast<const __m256i*>(blk + (st * kNJ + j) * 32));
        aw[j] = _mm256_abs_epi8(wv[j]);
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        int32_t x4;
        std::memcpy(&x4, xb + i * ldx + 4 * st, 4);
        const __m256i xv = _mm256_set1_epi32(x4);
#pragma GCC unroll 8
        for (int j = 0; j < kNJ; ++j) {
          const __m256i p = _mm256_maddubs_epi16(aw[j], _mm256_sign_epi8(xv, wv[j]));
          s[i][j] = _mm256_add_epi32(s[i][j], _mm256_madd_epi16(p, ones));
        }
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 sc = _mm256_set1_ps(xs[i * nb + b]);
#pragma GCC unroll 8
      for (int j = 0; j < kNJ; ++j) f[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i][j]), sc, f[i][j]);
    }
  }
  for (int j = 0; j < kNJ; ++j) {
    const int64_t left = std::min<int64_t>(8, nv - 8 * j);
    if (left <= 0) break;
    float wsb[8] = {};
    std::memcpy(wsb, ws + 8 * j, static_cast<size_t>(left) * sizeof(float));
    const __m256 wsv = _mm256_loadu_ps(wsb);
    for (int i = 0; i < MR; ++i) {  // f * ws, or out + f * ws with one rounding: the vnni tiles' bits
      float* o = out + i * ldo + 8 * j;
      float v[8] = {};
      if (acc) std::memcpy(v, o, static_cast<size_t>(left) * sizeof(float));
      const __m256 r = acc ? _mm256_fmadd_ps(f[i][j], wsv, _mm256_loadu_ps(v)) : _mm256_mul_ps(f[i][j], wsv);
      _mm256_storeu_ps(v, r);
      std::memcpy(o, v, static_cast<size_t>(left) * sizeof(float));
    }
  }
}

// The last left (< kMR) input rows: one tile of exactly that many.
template <int MR>
JTOK_AVX2_FN inline void tile_rest(float* out, int64_t ldo, const int8_t* xq, int64_t ldx, const float* xs, int64_t nb,
                                   const int8_t* panel, const float* ws, int64_t nv, bool acc, int64_t left) {
  if constexpr (MR > 0) {
    if (left == MR) tile<MR>(out, ldo, xq, ldx, xs, nb, panel, ws, nv, acc);
    else tile_rest<MR - 1>(out, ldo, xq, ldx, xs, nb, panel, ws, nv, acc, left);
  }
}

// Panel p (output rows p * kNR on) against all N input rows.
JTOK_AVX2_FN void panel_product(float* out, int8_t* panel, const int8_t* xq, const float* xs, const WeightMatrix& w,
                                int64_t N, int64_t Cp, int64_t nb, int64_t p, bool acc) {
  const int64_t OC = w.rows, o0 = p * kNR, nv = std::min(kNR, OC - o0);
  pack_panel(panel, w, o0, nb);
  const float* ws = w.scale + o0;
  int64_t n = 0;
  for (; n + kMR <= N; n += kMR)
    tile<kMR>(out + n * OC + o0, OC, xq + n * Cp, Cp, xs + n * nb, nb, panel, ws, nv, acc);
  tile_rest<kMR - 1>(out + n * OC + o0, OC, xq + n * Cp, Cp, xs + n * nb, nb, panel, ws, nv, acc, N - n);
}

}  // namespace

void q8_gemm_avx2_tiles(float* out, const int8_t* xq, const float* xs, const WeightMatrix& w, int64_t N, int64_t Cp,
                        int64_t nb, bool acc) {
  const int64_t npanels = (w.rows + kNR - 1) / kNR;
#pragma omp parallel if (N * w.rows * Cp >= (1 << 18))
  {
    std::vector<int8_t> buf(static_cast<size_t>(nb * kBlockBytes + 32));
    int8_t* panel = buf.data() + (32 - reinterpret_cast<uintptr_t>(buf.data()) % 32) % 32;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < npanels; ++p) panel_product(out, panel, xq, xs, w, N, Cp, nb, p, acc);
  }
}

}  // namespace jtok
