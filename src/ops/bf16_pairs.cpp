#include "ops/bf16_pairs.h"

#include <algorithm>
#include <array>
#include <vector>

#include <immintrin.h>

#include "ops/lowp_convert.h"

namespace jtok {
namespace {

inline uint32_t pair_of(float lo, float hi) {
  return static_cast<uint32_t>(f32_to_bf16(lo)) | (static_cast<uint32_t>(f32_to_bf16(hi)) << 16);
}

#if defined(__AVX512BF16__)
constexpr int kTileRows = 6;  // 6 rows x 4 vectors: 24 accumulators + 4 B vectors + 1 broadcast of 32 zmm

// Rows [0, MR) x columns [0, 16 NV) of C (the last vector's lanes masked by `tail`).
// Every loop over rows and vectors is unrolled by pragma: without it GCC 12 keeps the accumulator
// array in memory and stores all of it on every pair, which halved the tile's rate.
template <int MR, int NV>
void tile(int64_t Pn, float alpha, const uint32_t* A, int64_t a_row, int64_t a_pair, const uint32_t* B, int64_t ldb,
          float beta, float* C, int64_t ldc, __mmask16 tail) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < Pn; ++p) {
    const uint32_t* bp = B + p * ldb;
    __m512bh b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      b[v] = (__m512bh)(v == NV - 1 ? _mm512_maskz_loadu_epi32(tail, bp + 16 * v) : _mm512_loadu_si512(bp + 16 * v));
    const uint32_t* ap = A + p * a_pair;
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(ap[m * a_row]));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], a, b[v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      float* c = C + m * ldc + 16 * v;
      const __mmask16 k = v == NV - 1 ? tail : static_cast<__mmask16>(0xFFFF);
      __m512 r = _mm512_mul_ps(acc[m][v], va);
      if (beta != 0.0f) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(k, c));
      _mm512_mask_storeu_ps(c, k, r);
    }
}

using TileFn = void (*)(int64_t, float, const uint32_t*, int64_t, int64_t, const uint32_t*, int64_t, float, float*,
                        int64_t, __mmask16);
template <int MR>
constexpr std::array<TileFn, 4> kRowTiles = {&tile<MR, 1>, &tile<MR, 2>, &tile<MR, 3>, &tile<MR, 4>};
constexpr std::array<std::array<TileFn, 4>, kTileRows> kTiles = {kRowTiles<1>, kRowTiles<2>, kRowTiles<3>,
                                                                 kRowTiles<4>, kRowTiles<5>, kRowTiles<6>};
#endif

}  // namespace

void gemm_bf16_pairs(int64_t M, int64_t N, int64_t Pn, float alpha, const uint32_t* A, int64_t a_row, int64_t a_pair,
                     const uint32_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
#if defined(__AVX512BF16__)
  // Column panels of 64 outside, rows inside: the panel's B (Pn x 64 pairs) stays in cache.
  for (int64_t n0 = 0; n0 < N; n0 += 64) {
    const int64_t nw = std::min<int64_t>(64, N - n0), nv = (nw + 15) / 16;
    const __mmask16 tail = static_cast<__mmask16>((1u << (nw - 16 * (nv - 1))) - 1u);
    for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
      const int64_t mr = std::min<int64_t>(kTileRows, M - m0);
      kTiles[mr - 1][nv - 1](Pn, alpha, A + m0 * a_row, a_row, a_pair, B + n0, ldb, beta, C + m0 * ldc + n0, ldc, tail);
    }
  }
#else
  gemm_bf16_pairs_ref(M, N, Pn, alpha, A, a_row, a_pair, B, ldb, beta, C, ldc);
#endif
}

void gemm_bf16_pairs_ref(int64_t M, int64_t N, int64_t Pn, float alpha, const uint32_t* A, int64_t a_row,
                         int64_t a_pair, const uint32_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t p = 0; p < Pn; ++p) {
        const uint32_t a = A[m * a_row + p * a_pair], b = B[p * ldb + n];
        acc += static_cast<double>(bf16_to_f32(static_cast<uint16_t>(a))) * bf16_to_f32(static_cast<uint16_t>(b)) +
               static_cast<double>(bf16_to_f32(static_cast<uint16_t>(a >> 16))) * bf16_to_f32(static_cast<uint16_t>(b >> 16));
      }
      float* c = C + m * ldc + n;
      *c = static_cast<float>(alpha * acc + (beta != 0.0f ? static_cast<double>(*c) : 0.0));
    }
}

void pack_pairs_along_rows(uint32_t* dst, const float* x, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t pc = (cols + 1) / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = x + r * ld;
    uint32_t* d = dst + r * pc;
    int64_t p = 0;
#if defined(__AVX512BF16__)
    for (; 2 * p + 32 <= cols; p += 16) {  // 32 values in order are 16 pairs in order
      const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + 2 * p + 16), _mm512_loadu_ps(s + 2 * p));
      _mm512_storeu_si512(d + p, (__m512i)v);
    }
#endif
    for (; p < pc; ++p) d[p] = pair_of(s[2 * p], 2 * p + 1 < cols ? s[2 * p + 1] : 0.0f);
  }
}

void pack_row_pairs(uint32_t* dst, int64_t ldd, const float* x, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    const float* lo = x + 2 * p * ld;
    const float* hi = 2 * p + 1 < rows ? lo + ld : nullptr;
    uint32_t* d = dst + p * ldd;
    int64_t c = 0;
#if defined(__AVX512BF16__)
    // The all-lanes maskz forms: GCC 12 warns of the unmasked ones' undefined pass-through.
    constexpr __mmask16 all = 0xffff;
    for (; c + 16 <= cols; c += 16) {
      const __m512i l = _mm512_maskz_cvtepu16_epi32(all, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(lo + c)));
      const __m512i h = hi ? _mm512_maskz_cvtepu16_epi32(all, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(hi + c)))
                           : _mm512_setzero_si512();
      _mm512_storeu_si512(d + c, _mm512_or_si512(l, _mm512_maskz_slli_epi32(all, h, 16)));
    }
#endif
    for (; c < cols; ++c) d[c] = pair_of(lo[c], hi ? hi[c] : 0.0f);
  }
}

void pack_transposed_pairs(uint32_t* dst, int64_t ldd, const float* x, int64_t rows, int64_t cols, int64_t ld) {
  // 16 rows at a time: their pairs packed along the rows, then each pair index written as 16
  // consecutive values. One row at a time would store to cols / 2 lines ldd apart, which alias in L1
  // when ldd is a multiple of 1024 (T = 1024: the packer took 11 % of the attention's time).
  constexpr int64_t kRows = 16;
  const int64_t pc = (cols + 1) / 2;
  thread_local std::vector<uint32_t> block;
  block.resize(static_cast<size_t>(kRows * pc));
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int64_t rn = std::min(kRows, rows - r0);
    pack_pairs_along_rows(block.data(), x + r0 * ld, rn, cols, ld);
    for (int64_t p = 0; p < pc; ++p)
      for (int64_t i = 0; i < rn; ++i) dst[p * ldd + r0 + i] = block[i * pc + p];
  }
}

}  // namespace jtok
