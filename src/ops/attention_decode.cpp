// One query row against a KV cache (decoding): the scores, their softmax and the weighted sum of
// values, for an fp32 or a bf16 cache.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <omp.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
// GCC 12's AVX-512 headers trip its own -Wmaybe-uninitialized (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "core/parallel.h"
#include "ops/attention.h"
#include "ops/attention_blocks.h"

namespace jtok {

// A cached key or value as fp32 (bf16: its 16 bits are the top of the float's).
static inline float kv_value(float x) { return x; }
static inline float kv_value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Rows this far ahead of the one being read are prefetched (2 measured best of 1-16 at 640
// positions, config b's and Qwen3's heads: bf16 1.3 -> 1.06 ms, f32 2.5 -> 2.25 ms a token).
constexpr int64_t kPrefetchRows = 2;

// Prefetches the slices of cached row `row` that heads h0..h1 read (when `live`).
template <typename KVT>
static inline void prefetch_heads(const KVT* row, bool live, int64_t h0, int64_t h1, int64_t group, int64_t hd) {
  if (!live) return;
  const char* p = reinterpret_cast<const char*>(row + h0 / group * hd);
  const int64_t bytes = ((h1 - 1) / group - h0 / group + 1) * hd * static_cast<int64_t>(sizeof(KVT));
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
}

// sh[0..n) <- softmax(sh[0..n)).
static void softmax_in_place(float* sh, int64_t n) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; ++j) mx = sh[j] > mx ? sh[j] : mx;
  const float sum = attn::exp_row(sh, n, n, mx);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) sh[j] /= sum;
}

// q . k over hd in one order for every cache type, so that the bf16 cache's scores are the fp32
// kernel's on the same values bit for bit (an `omp simd` reduction let the compiler pick the order
// per instantiation: on an AVX2 host the two differed in the last bit). AVX2: 16 elements a step
// into two 8-lane FMA sums, added, then summed across lanes in a fixed tree; the tail and other
// ISAs element by element.
#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 load8(const uint16_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}
#endif
template <typename KVT>
static inline float dot_fixed_order(const float* qh, const KVT* kj, int64_t hd) {
  int64_t i = 0;
  float acc = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (; i + 16 <= hd; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i), load8(kj + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i + 8), load8(kj + i + 8), a1);
  }
  const __m256 a = _mm256_add_ps(a0, a1);
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  acc = _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
#endif
  for (; i < hd; ++i) acc += qh[i] * kv_value(kj[i]);
  return acc;
}

// Any head size, any ISA: the compiler's vector code per (position, head).
template <typename KVT>
static void scores_plain(float* scratch, const float* q, const KVT* k_cache, int64_t n, int64_t h0, int64_t h1,
                         int64_t kvd, int64_t group, int64_t hd, float scale) {
  for (int64_t j = 0; j < n; ++j) {
    const KVT* kr = k_cache + j * kvd;
    for (int64_t h = h0; h < h1; ++h)
      scratch[h * n + j] = dot_fixed_order(q + h * hd, kr + (h / group) * hd, hd) * scale;
  }
}

template <typename KVT>
static void values_plain(float* out, const float* scratch, const KVT* v_cache, int64_t n, int64_t h0, int64_t h1,
                         int64_t kvd, int64_t group, int64_t hd) {
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t i = 0; i < hd; ++i) out[h * hd + i] = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const KVT* vr = v_cache + j * kvd;
    for (int64_t h = h0; h < h1; ++h) {
      const float w = scratch[h * n + j];
      const KVT* vj = vr + (h / group) * hd;
      float* oh = out + h * hd;
#pragma omp simd
      for (int64_t i = 0; i < hd; ++i) oh[i] += w * kv_value(vj[i]);
    }
  }
}

#if defined(__AVX512F__)
static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16(const uint16_t* p) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// Lane sums of 16 vectors a0..a15 as one vector (lane j = the sum of aj's lanes) by a transposing
// tree: 45 shuffles and adds where 16 horizontal sums would take ~130. In two halves:
// sum_lanes4(a4i .. a4i+3) -> per 128-bit lane L, the sums over lane L of a4i .. a4i+3;
// sum_quarters(four of those) -> the 16 sums.
static inline __m512 sum_lanes4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 x0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 x1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512d p = _mm512_castps_pd(x0), r = _mm512_castps_pd(x1);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(p, r)), _mm512_castpd_ps(_mm512_unpackhi_pd(p, r)));
}
static inline __m512 sum_quarters(const __m512* y) {
  const __m512 z0 = _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x88), _mm512_shuffle_f32x4(y[0], y[1], 0xDD));
  const __m512 z1 = _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], 0x88), _mm512_shuffle_f32x4(y[2], y[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, 0x88), _mm512_shuffle_f32x4(z0, z1, 0xDD));
}

// The per-lane products of q and cached key row j (hd / 16 FMAs); zero past the last position.
template <typename KVT>
static inline __m512 key_products(const float* qh, const KVT* kj, int64_t nc, bool live) {
  __m512 acc = _mm512_setzero_ps();
  if (live)
    for (int64_t c = 0; c < nc; ++c) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * c), load16(kj + 16 * c), acc);
  return acc;
}

// Scores of heads h0..h1 against positions 0..n, 16 positions at a time. Each cached row is read
// once, front to back, for all the heads (a head at a time strides kvd per key and the prefetchers
// miss; 4 rows at a time per head measured 1.4x slower): its per-lane products go to
// part[h][jj], and after 16 rows one transposing sum per head makes 16 scores. hd a multiple of
// 16, at most 256.
template <typename KVT>
static void scores_avx512(float* scratch, const float* q, const KVT* k_cache, int64_t n, int64_t h0, int64_t h1,
                          int64_t kvd, int64_t group, int64_t hd, float scale) {
  const int64_t nc = hd / 16, nh = h1 - h0;
  const __m512 vscale = _mm512_set1_ps(scale);
  // [head][position in block][lane]; one per thread, kept between calls (a decoding step calls this
  // once a layer) and grown as needed. Every entry read was written in the same block first.
  thread_local std::vector<float> part;
  if (part.size() < static_cast<size_t>(nh * 256)) part.resize(static_cast<size_t>(nh * 256));
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int64_t m = std::min<int64_t>(16, n - j0);
    for (int64_t jj = 0; jj < 16; ++jj) {
      const KVT* kr = k_cache + (j0 + jj) * kvd;
      prefetch_heads(kr + kPrefetchRows * kvd, j0 + jj + kPrefetchRows < n, h0, h1, group, hd);
      for (int64_t h = h0; h < h1; ++h)
        _mm512_storeu_ps(&part[((h - h0) * 16 + jj) * 16], key_products(q + h * hd, kr + (h / group) * hd, nc, jj < m));
    }
    for (int64_t h = h0; h < h1; ++h) {
      const float* a = &part[(h - h0) * 256];
      __m512 y[4];
      for (int i = 0; i < 4; ++i)
        y[i] = sum_lanes4(_mm512_loadu_ps(a + 64 * i), _mm512_loadu_ps(a + 64 * i + 16), _mm512_loadu_ps(a + 64 * i + 32),
                          _mm512_loadu_ps(a + 64 * i + 48));
      const __m512 s = _mm512_mul_ps(sum_quarters(y), vscale);
      _mm512_mask_storeu_ps(scratch + h * n + j0, static_cast<__mmask16>((1u << m) - 1), s);
    }
  }
}

#endif

template <typename KVT>
static void attention_decode_t(float* out, const float* q, const KVT* k_cache, const KVT* v_cache, int64_t t, int64_t H,
                               int64_t KV, int64_t hd, float* scratch) {
  const int64_t kvd = KV * hd, group = H / KV, n = t + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#if defined(__AVX512F__)
  const bool vec = hd % 16 == 0 && hd <= 256;
#else
  const bool vec = false;
#endif
  // The heads are split among the threads (a decoding step's one query row has no other
  // parallelism); per head the operations and their order do not depend on the split.
#pragma omp parallel if (n * kvd >= kParallelMin && !omp_in_parallel())
  {
    const int64_t nt = omp_get_num_threads(), th = omp_get_thread_num();
    const int64_t h0 = H * th / nt, h1 = H * (th + 1) / nt;
#if defined(__AVX512F__)
    if (vec) scores_avx512(scratch, q, k_cache, n, h0, h1, kvd, group, hd, scale);
#endif
    if (!vec) scores_plain(scratch, q, k_cache, n, h0, h1, kvd, group, hd, scale);
    for (int64_t h = h0; h < h1; ++h) softmax_in_place(scratch + h * n, n);
    values_plain(out, scratch, v_cache, n, h0, h1, kvd, group, hd);
  }
}

void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache, int64_t t, int64_t H,
                      int64_t KV, int64_t hd, float* scratch) {
  attention_decode_t(out, q, k_cache, v_cache, t, H, KV, hd, scratch);
}

void attention_decode_bf16(float* out, const float* q, const uint16_t* k_cache, const uint16_t* v_cache, int64_t t,
                           int64_t H, int64_t KV, int64_t hd, float* scratch) {
  attention_decode_t(out, q, k_cache, v_cache, t, H, KV, hd, scratch);
}

}  // namespace jtok
