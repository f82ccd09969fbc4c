#include "ops/lowp_linear.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
// GCC 12's AVX-512 headers trip its own -Wmaybe-uninitialized (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define JTOK_AVX2_TILE 1
#endif

#include "core/error.h"
#include "ops/linear.h"
#include "ops/lowp_gemm.h"
#include "ops/q8_gemm.h"

namespace jtok {

static void check_shape(const WeightMatrix& w) {
  JTOK_CHECK(w.data != nullptr && w.rows > 0 && w.cols > 0, "linear_forward_lowp: unbound weight matrix");
  JTOK_CHECK(w.dtype != Dtype::int8 || w.scale != nullptr, "linear_forward_lowp: int8 weights without scales");
}

// The activation rows of an int8 product, quantised (N rows of C values, nb = ceil(C/32) scales each).
struct ActQ8 {
  std::vector<int8_t> q;
  std::vector<float> s;
  int64_t C = 0, nb = 0;
  void quantize(const float* x, int64_t N, int64_t C_) {
    C = C_;
    nb = (C + kActBlock - 1) / kActBlock;
    q.resize(static_cast<size_t>(N * C));
    s.resize(static_cast<size_t>(N * nb));
    for (int64_t n = 0; n < N; ++n) quantize_act_q8(q.data() + n * C, s.data() + n * nb, x + n * C, C);
  }
};

// inp with every row replaced by its quantised values q * scale (as floats): what the int8 product
// multiplies, for the reference and the converted-panel path.
static void fake_quantize_act(float* out, const float* inp, int64_t N, int64_t C) {
  ActQ8 a;
  a.quantize(inp, N, C);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = static_cast<float>(a.q[n * C + c]) * a.s[n * a.nb + c / kActBlock];
}


static bool uses_lowp_gemm(const WeightMatrix& w, int64_t N, RowKernel rk);

void linear_forward_lowp_ref(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate,
                             RowKernel rk) {
  check_shape(w);
  const int64_t C = w.cols;
  std::vector<float> W(static_cast<size_t>(w.rows * C)), y(static_cast<size_t>(N * w.rows));
  dequantize_rows(W.data(), w, 0, w.rows);
  std::vector<float> xq(static_cast<size_t>(N * C));
  if (uses_lowp_gemm(w, N, rk)) {
    lowp_gemm_input_ref(xq.data(), inp, w.dtype, N, C);
    inp = xq.data();
  } else if (w.dtype == Dtype::int8) {  // the per-row kernels': one scale per block of 32
    fake_quantize_act(xq.data(), inp, N, C);
    inp = xq.data();
  }
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

// The portable int8 x int8 product of weight rows [o0, o0+nr) with the quantised input rows: exact
// int32 sums per block of 32, scaled by the block's activation scale, summed, times the row's scale.
static inline void q8_dot_rows(float* out, int64_t ldo, const ActQ8& a, int64_t N, const WeightMatrix& w, int64_t o0,
                               int64_t nr, bool acc) {
  const int64_t C = w.cols;
  for (int64_t r = 0; r < nr; ++r) {
    const int8_t* wr = static_cast<const int8_t*>(w.data) + (o0 + r) * C;
    for (int64_t n = 0; n < N; ++n) {
      const int8_t* xr = a.q.data() + n * C;
      float sum = 0.0f;
      for (int64_t b = 0; b < a.nb; ++b) {
        const int64_t c0 = b * kActBlock, c1 = std::min(C, c0 + kActBlock);
        int32_t isum = 0;
        for (int64_t c = c0; c < c1; ++c) isum += static_cast<int32_t>(xr[c]) * wr[c];
        sum += static_cast<float>(isum) * a.s[n * a.nb + b];
      }
      float& o = out[n * ldo + r];
      o = (acc ? o : 0.0f) + sum * w.scale[o0 + r];
    }
  }
}

#if defined(__AVX512F__) || defined(JTOK_AVX2_TILE)
#define JTOK_TILE 1
#ifndef JTOK_PREFETCH_BLOCKS  // only for a sweep (bench/decode_gemv.cpp)
#define JTOK_PREFETCH_BLOCKS 1
#endif
#ifndef JTOK_SEQ_ROWS_MAX_INPUTS  // only for a sweep (bench/decode_gemv.cpp)
#define JTOK_SEQ_ROWS_MAX_INPUTS 2
#endif
// The register tiles prefetch the weights of the row block this many blocks ahead, a line at a
// time: a block's four rows are four short streams (768 B to 3 KB at d 768) that the hardware's
// prefetchers do not run far enough ahead of. bench/decode_gemv, config b's step, 1 thread, loaded
// machine: f32 14.0 -> 15.1, bf16 8.6 -> 12.4, int8 9.2 -> 12.5 GB/s of weights (2 and 4 blocks: no better).
constexpr int64_t kPrefetchBlocks = JTOK_PREFETCH_BLOCKS;

// The f32 / bf16 register tile's vector. AVX-512: 16 lanes, up to 4 input rows (16 accumulators).
// AVX2 + FMA (hosts without AVX-512): 8 lanes, up to 2 input rows (4 x 2 accumulators, 4 weight
// vectors and an input: 13 of the 16 ymm registers).
#if defined(__AVX512F__)
struct Lanes {
  using V = __m512;
  static constexpr int64_t n = 16;
  static constexpr int max_inputs = 4;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const uint16_t* p) {  // bf16, converted in registers
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
};
#else
struct Lanes {
  using V = __m256;
  static constexpr int64_t n = 8;
  static constexpr int max_inputs = 2;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const uint16_t* p) {  // bf16, converted in registers
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(V v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
  }
};
#endif

// A register tile: kRowBlock f32 or bf16 weight rows (from o0) times MT input rows (from x, row
// stride C); out[n * ldo + r] (+)= the dot product. Each (weight row, input row) pair has its own
// accumulator summed in column order, so a row's sum does not depend on MT or N, nor on the loop
// order, which the number of inputs picks:
// - up to kSeqRowsMaxInputs inputs, the rows one after the other, each read front to back: one
//   sequential stream at a time, which the hardware prefetchers follow. Four rows interleaved ran
//   at 0.74x the bandwidth for f32 at one input on Zen 4 (bench/decode_gemv.cpp, config b, 1 thread:
//   14.3 -> 19.5 GB/s; bf16 11.8 -> 16.3);
// - more inputs, the four rows' vectors loaded together and each used MT times: fewer loads, where
//   the sequential order becomes load-bound (f32 at 4 inputs: 13.6 against 11.9 GB/s).
constexpr int kSeqRowsMaxInputs = JTOK_SEQ_ROWS_MAX_INPUTS;
template <Dtype DT, int MT>
static inline void tile_kernel(float* out, int64_t ldo, const float* x, const WeightMatrix& w, int64_t o0, bool acc) {
  using Elem = std::conditional_t<DT == Dtype::f32, float, uint16_t>;
  const int64_t C = w.cols;
  const Elem* row[kRowBlock];
  for (int r = 0; r < kRowBlock; ++r) row[r] = static_cast<const Elem*>(w.data) + (o0 + r) * C;
  Lanes::V a[kRowBlock][MT];
  for (auto& rr : a)
    for (auto& v : rr) v = Lanes::zero();
  const auto prefetch = [&](int r, int64_t c) {
    if ((c * static_cast<int64_t>(sizeof(Elem))) % 64 == 0)  // once per cache line
      _mm_prefetch(reinterpret_cast<const char*>(row[r] + kPrefetchBlocks * kRowBlock * C + c), _MM_HINT_T0);
  };
  if constexpr (MT <= kSeqRowsMaxInputs) {
    for (int r = 0; r < kRowBlock; ++r)
      for (int64_t c = 0; c < C; c += Lanes::n) {
        prefetch(r, c);
        const Lanes::V wv = Lanes::load(row[r] + c);
        for (int n = 0; n < MT; ++n) a[r][n] = Lanes::fma(Lanes::load(x + n * C + c), wv, a[r][n]);
      }
  } else {
    for (int64_t c = 0; c < C; c += Lanes::n) {
      Lanes::V wv[kRowBlock];
      for (int r = 0; r < kRowBlock; ++r) prefetch(r, c);
      for (int r = 0; r < kRowBlock; ++r) wv[r] = Lanes::load(row[r] + c);
      for (int n = 0; n < MT; ++n) {
        const Lanes::V xv = Lanes::load(x + n * C + c);
        for (int r = 0; r < kRowBlock; ++r) a[r][n] = Lanes::fma(xv, wv[r], a[r][n]);
      }
    }
  }
  for (int r = 0; r < kRowBlock; ++r)
    for (int n = 0; n < MT; ++n) {
      float& o = out[n * ldo + r];
      o = (acc ? o : 0.0f) + Lanes::sum(a[r][n]);
    }
}

// The last left (< Lanes::max_inputs) input rows: one tile of exactly that many.
template <Dtype DT, int MT>
static inline void tile_rest(float* out, int64_t OC, const float* x, int64_t left, const WeightMatrix& w, int64_t o0,
                             bool acc) {
  if (left == MT) tile_kernel<DT, MT>(out, OC, x, w, o0, acc);
  else if constexpr (MT > 1) tile_rest<DT, MT - 1>(out, OC, x, left, w, o0, acc);
}

// All N input rows against one block of weight rows, Lanes::max_inputs input rows at a time.
template <Dtype DT>
static inline void block_kernel(float* out, int64_t OC, const float* inp, int64_t N, const WeightMatrix& w, int64_t o0,
                                bool acc) {
  constexpr int M = Lanes::max_inputs;
  const int64_t C = w.cols;
  int64_t n = 0;
  for (; n + M <= N; n += M) tile_kernel<DT, M>(out + n * OC + o0, OC, inp + n * C, w, o0, acc);
  if constexpr (M > 1)
    if (n < N) tile_rest<DT, M - 1>(out + n * OC + o0, OC, inp + n * C, N - n, w, o0, acc);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define JTOK_HAVE_VNNI 1
// int8 x int8 register tile (vpdpbusd, unsigned x signed bytes): |x| as the unsigned operand, the
// sign of x moved onto the weights (w and x both in [-127, 127], so -w never overflows). Per 64
// columns, lanes 0-7 hold block 2k's four-product sums and lanes 8-15 block 2k+1's: exact int32,
// converted and multiplied by that block's activation scale (sv: xs16, 16 lanes per 64 columns).
// The loop order as tile_kernel's, rows one after the other up to kSeqRowsMaxInputsQ8 inputs
// (bench/decode_gemv.cpp, config b, 1 thread, against interleaved rows: 1.95x at one input, 1.6x at
// two, 1.28x at three, 1.08x at four; two tiles of four 0.85x: the input's sign work, redone per
// row, then outweighs the stream).
constexpr int kSeqRowsMaxInputsQ8 = 3;
template <int MT>
static inline void tile_q8(float* out, int64_t ldo, const int8_t* xq, const float* xs16, const WeightMatrix& w,
                           int64_t o0, bool acc) {
  const int64_t C = w.cols;
  const int8_t* row[kRowBlock];
  for (int r = 0; r < kRowBlock; ++r) row[r] = static_cast<const int8_t*>(w.data) + (o0 + r) * C;
  __m512 a[kRowBlock][MT];
  for (auto& rr : a)
    for (auto& v : rr) v = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  // Input n's columns [c, c + 64) against the 64 weights wv of row r.
  const auto madd = [&](int r, int n, int64_t c, int64_t k, __m512i wv) {
    const __m512i qx = _mm512_loadu_si512(xq + n * C + c);
    const __m512i ws = _mm512_mask_sub_epi8(wv, _mm512_movepi8_mask(qx), zero, wv);
    const __m512i d = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(qx), ws);
    a[r][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_loadu_ps(xs16 + n * (C / 4) + k * 16), a[r][n]);
  };
  const auto prefetch = [&](int r, int64_t c) {
    _mm_prefetch(reinterpret_cast<const char*>(row[r] + kPrefetchBlocks * kRowBlock * C + c), _MM_HINT_T0);
  };
  if constexpr (MT <= kSeqRowsMaxInputsQ8) {
    for (int r = 0; r < kRowBlock; ++r)
      for (int64_t c = 0, k = 0; c < C; c += 64, ++k) {
        prefetch(r, c);
        const __m512i wv = _mm512_loadu_si512(row[r] + c);
        for (int n = 0; n < MT; ++n) madd(r, n, c, k, wv);
      }
  } else {
    for (int64_t c = 0, k = 0; c < C; c += 64, ++k) {
      __m512i wv[kRowBlock];
      for (int r = 0; r < kRowBlock; ++r) prefetch(r, c);
      for (int r = 0; r < kRowBlock; ++r) wv[r] = _mm512_loadu_si512(row[r] + c);
      for (int n = 0; n < MT; ++n)
        for (int r = 0; r < kRowBlock; ++r) madd(r, n, c, k, wv[r]);
    }
  }
  for (int r = 0; r < kRowBlock; ++r) {
    const float s = w.scale[o0 + r];
    for (int n = 0; n < MT; ++n) {
      float& o = out[n * ldo + r];
      o = (acc ? o : 0.0f) + _mm512_reduce_add_ps(a[r][n]) * s;
    }
  }
}

static inline void block_q8(float* out, int64_t OC, const int8_t* xq, const float* xs16, int64_t N, const WeightMatrix& w,
                            int64_t o0, bool acc) {
  const int64_t C = w.cols, C4 = C / 4;
  int64_t n = 0;
  for (; n + 4 <= N; n += 4) tile_q8<4>(out + n * OC + o0, OC, xq + n * C, xs16 + n * C4, w, o0, acc);
  switch (N - n) {
    case 3: tile_q8<3>(out + n * OC + o0, OC, xq + n * C, xs16 + n * C4, w, o0, acc); break;
    case 2: tile_q8<2>(out + n * OC + o0, OC, xq + n * C, xs16 + n * C4, w, o0, acc); break;
    case 1: tile_q8<1>(out + n * OC + o0, OC, xq + n * C, xs16 + n * C4, w, o0, acc); break;
    default: break;
  }
}
#endif

// One product of a gemv batch: out (N, w.rows) (+)= inp (N, w.cols) @ w^T.
struct GemvJob {
  float* out;
  WeightMatrix w;
  bool acc;
  const ActQ8* q8 = nullptr;   // int8: the quantised input
  const float* xs16 = nullptr;  // int8 with the VNNI tile: the block scales, 16 lanes per 64 columns
};

// Weight rows [o0, o0 + nr) of one job against all N input rows.
static void gemv_block(const GemvJob& j, const float* inp, int64_t N, int64_t o0, int64_t nr, std::vector<float>& wb) {
  const WeightMatrix& w = j.w;
  const int64_t OC = w.rows, C = w.cols;
  if (w.dtype == Dtype::int8) {
#if defined(JTOK_HAVE_VNNI)
    if (j.xs16 && nr == kRowBlock) {
      block_q8(j.out, OC, j.q8->q.data(), j.xs16, N, w, o0, j.acc);
      return;
    }
#endif
    q8_dot_rows(j.out + o0, OC, *j.q8, N, w, o0, nr, j.acc);
    return;
  }
#if defined(JTOK_TILE)
  if (nr == kRowBlock && C % Lanes::n == 0) {
    if (w.dtype == Dtype::f32) block_kernel<Dtype::f32>(j.out, OC, inp, N, w, o0, j.acc);
    else block_kernel<Dtype::bf16>(j.out, OC, inp, N, w, o0, j.acc);
    return;
  }
#endif
  float r4[kRowBlock];
  const float* rows = static_cast<const float*>(w.data) + o0 * C;  // f32: the rows in place
  if (w.dtype != Dtype::f32) {
    wb.resize(static_cast<size_t>(kRowBlock * C));
    dequantize_rows(wb.data(), w, o0, o0 + nr);
    rows = wb.data();
  }
  for (int64_t n = 0; n < N; ++n) {
    dot_rows(r4, inp + n * C, rows, C, nr);
    float* o = j.out + n * OC + o0;
    for (int64_t r = 0; r < nr; ++r) o[r] = j.acc ? o[r] + r4[r] : r4[r];
  }
}

// Few input rows, one or more matrices of the same input: one parallel region; the blocks of
// kRowBlock weight rows of all jobs, in order, are split into one contiguous range per thread
// (each thread streams its own stretch of weights), each block meeting the input rows four at a time.
static void gemv_jobs(GemvJob* jobs, int njobs, const float* inp, int64_t N) {
  const int64_t C = jobs[0].w.cols;
  // int8: the input quantised once for all jobs (and its block scales spread to 16 lanes per 64 columns).
  thread_local ActQ8 q8;
  thread_local std::vector<float> xs16;
  bool any_int8 = false;
  for (int i = 0; i < njobs; ++i) any_int8 = any_int8 || jobs[i].w.dtype == Dtype::int8;
  if (any_int8) {
    q8.quantize(inp, N, C);
    bool vnni = false;
#if defined(JTOK_HAVE_VNNI)
    vnni = C % 64 == 0 && q8_kernels() == Q8Kernels::vnni;
    if (vnni) {
      const int64_t C4 = C / 4;
      xs16.resize(static_cast<size_t>(N * C4));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < C4; ++i) xs16[n * C4 + i] = q8.s[n * q8.nb + (i / 8)];  // lane i of 64-col chunk k: block 2k + (i%16)/8
    }
#endif
    for (int i = 0; i < njobs; ++i) {
      jobs[i].q8 = &q8;
      jobs[i].xs16 = vnni ? xs16.data() : nullptr;
    }
  }
  int64_t total = 0, work = 0;
  std::vector<int64_t> first(static_cast<size_t>(njobs) + 1);
  for (int i = 0; i < njobs; ++i) {
    first[i] = total;
    total += (jobs[i].w.rows + kRowBlock - 1) / kRowBlock;
    work += jobs[i].w.rows * C;
  }
  first[njobs] = total;
  const GemvJob* J = jobs;
#pragma omp parallel if (work >= (1 << 16))
  {
    std::vector<float> wb;  // the dequantised block of the portable path (left empty on the fast ones)
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t b0 = total * t / nt, b1 = total * (t + 1) / nt;
    int i = 0;
    for (int64_t b = b0; b < b1; ++b) {
      while (b >= first[i + 1]) ++i;
      const int64_t o0 = (b - first[i]) * kRowBlock, nr = std::min(kRowBlock, J[i].w.rows - o0);
      gemv_block(J[i], inp, N, o0, nr, wb);
    }
  }
}

// Many input rows: panels of weight rows converted to fp32, each multiplied by sgemm.
constexpr int64_t kPanelRows = 256;

static void gemm_lowp(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool acc) {
  const int64_t OC = w.rows, C = w.cols;
  std::vector<float> xq;
  if (w.dtype == Dtype::int8) {  // the int8 product's input: quantised per block of 32, as the gemv
    xq.resize(static_cast<size_t>(N * C));
    fake_quantize_act(xq.data(), inp, N, C);
    inp = xq.data();
  }
  std::vector<float> panel(static_cast<size_t>(std::min(kPanelRows, OC) * C));
  for (int64_t r0 = 0; r0 < OC; r0 += kPanelRows) {
    const int64_t r1 = std::min(OC, r0 + kPanelRows);
#pragma omp parallel for schedule(static)
    for (int64_t o = r0; o < r1; ++o) dequantize_rows(panel.data() + (o - r0) * C, w, o, o + 1);
    gemm(false, true, N, r1 - r0, C, 1.0f, inp, C, panel.data(), C, acc ? 1.0f : 0.0f, out + r0, OC);
  }
}

// f32 weights take the register tile for N <= kF32GemvRows (sgemm's N = 1..4 paths read the weights
// no faster, and cost a call and its own parallel region per matrix); not under bf16 matmul
// precision, where gemm() rounds to bf16.
constexpr int64_t kF32GemvRows = 4;
static bool f32_gemv(const WeightMatrix& w, int64_t N) {
#if defined(JTOK_TILE)
  return N <= kF32GemvRows && w.cols % Lanes::n == 0 && matmul_precision() == MatmulPrecision::fp32;
#else
  (void)w, (void)N;
  return false;
#endif
}

// bf16 / int8 weights take the per-row kernels for N <= this under RowKernel::fastest, above it
// the bf16 / int8 products (lowp_gemm) where the CPU has them, else panels + sgemm.
// lowp_gemm: measured (bench/decode_gemv.cpp, config b's step, 1 thread, Zen 4, load ~11 on 2
// cores) against the per-row kernels, bf16: N 6 0.96x, N 8 0.95x, N 10 1.17x, N 12 1.41x, N 16
// 1.70x; int8 (ops/q8_gemm.h, load ~12): N 4 0.62x, N 8 0.91x, N 10 1.06x, N 12 1.18x, N 16 1.36x:
// the switch at 8 for both. The avx2 int8 tiles (ops/q8_gemm.h) take the same switch: at 16 rows
// they ran 5-7x the portable per-row loops they replace (docs/benchmarks.md; not measured below 16).
constexpr int64_t kLowpGemmMinRows = 9;
// Panels + sgemm: measured (the same bench, AVX-512 with VNNI; docs/benchmarks.md) the per-row
// kernels stay ahead up to N 24 for bf16 (1.21x at 17, 1.05x at 24, 0.93x at 32); for int8 with
// the VNNI tile they lead by 1.78x at 17, 1.26x at 32, 1.07x at 48 and 1.05x at 64, and the switch
// is kept at 48, past which the gain is within the noise. Other hosts keep kLowpGemvRows (not
// measured there).
int64_t lowp_gemv_max_rows(const WeightMatrix& w) {
  if (w.dtype != Dtype::f32 && lowp_gemm_enabled(w.dtype)) return kLowpGemmMinRows - 1;
#if defined(__AVX512F__)
  if (w.dtype == Dtype::bf16 && w.cols % Lanes::n == 0) return 24;
#endif
#if defined(JTOK_HAVE_VNNI)
  if (w.dtype == Dtype::int8 && w.cols % 64 == 0 && q8_kernels() == Q8Kernels::vnni) return 48;
#endif
  (void)w;
  return kLowpGemvRows;
}

const char* lowp_per_row_kernel_name(Dtype t, int64_t cols) {
#if defined(JTOK_HAVE_VNNI)
  if (t == Dtype::int8 && cols % 64 == 0 && q8_kernels() == Q8Kernels::vnni)
    return "4-row register tiles, int8 x int8 (avx512_vnni vpdpbusd)";
#endif
#if defined(JTOK_TILE)
  if (t != Dtype::int8 && cols % Lanes::n == 0)
    return Lanes::n == 16 ? "4-row register tiles (avx512)" : "4-row register tiles (avx2)";
#endif
  (void)t, (void)cols;
  return "portable dot products";
}

// bf16 / int8 weights, many rows, a CPU with the instructions: the product in bf16 / int8 (ops/lowp_gemm.h).
static bool uses_lowp_gemm(const WeightMatrix& w, int64_t N, RowKernel rk) {
  return w.dtype != Dtype::f32 && rk == RowKernel::fastest && N > lowp_gemv_max_rows(w) &&
         lowp_gemm_enabled(w.dtype);
}

void linear_forward_lowp(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate, RowKernel rk) {
  LinearOut o{out, w, accumulate};
  linear_forward_lowp_multi(&o, 1, inp, N, rk);
}

void linear_forward_lowp_multi(const LinearOut* outs, int n, const float* inp, int64_t N, RowKernel rk) {
  if (N <= 0 || n <= 0) return;
  for (int i = 0; i < n; ++i) {
    check_shape(outs[i].w);
    JTOK_CHECK(outs[i].w.cols == outs[0].w.cols, "linear_forward_lowp_multi: matrix ", i, " has ", outs[i].w.cols,
               " columns, matrix 0 ", outs[0].w.cols);
  }
  std::vector<GemvJob> jobs;
  std::vector<LinearProduct> f32;  // one call: at bf16 matmul precision the input is rounded once
  for (int i = 0; i < n; ++i) {
    const LinearOut& o = outs[i];
    const WeightMatrix& w = o.w;
    if (rk == RowKernel::per_row || (w.dtype == Dtype::f32 ? f32_gemv(w, N) : N <= lowp_gemv_max_rows(w))) {
      jobs.push_back({o.out, w, o.accumulate});
    } else if (w.dtype == Dtype::f32) {
      f32.push_back({o.out, static_cast<const float*>(w.data), w.rows, o.accumulate});
    } else if (uses_lowp_gemm(w, N, rk)) {
      lowp_gemm(o.out, inp, w, N, o.accumulate);
    } else {
      gemm_lowp(o.out, inp, w, N, o.accumulate);
    }
  }
  if (!f32.empty()) linear_forward_many(f32.data(), static_cast<int>(f32.size()), inp, N, outs[0].w.cols);
  if (!jobs.empty()) gemv_jobs(jobs.data(), static_cast<int>(jobs.size()), inp, N);
}

}  // namespace jtok
