// MoE's grouped expert products (src/cuda/grouped_linear.h). Every product is out (M,N) = A (M,K)
// B (N,K)^T over tiles of kBM x kBN outputs, a block a tile, the sum kBK at a time in order; A and B
// staged in shared memory as (rows, kBK) row-major whichever way they lie in memory:
//   forward      out y  (rows_e, OC): A = x (rows_e, C), B = W_e (OC, C)              (K = C)
//   input grad   out dx (rows_e, C):  A = dy (rows_e, OC), B = W_e^T: (C, OC)          (K = OC)
//   weight grad  out dW_e (OC, C):    A = dy^T (OC, rows_e), B = x^T (C, rows_e)       (K = rows_e)
// The row products' blocks are (output column tiles, row tiles of all experts in expert order): a
// block finds its expert by walking the offsets (E steps); blocks past the last tile exit. The weight
// gradient's blocks are (C tiles, OC tiles, experts); an expert without rows leaves its gradient.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/grouped_linear.h"
#include "cuda/mma_bf16.cuh"
#include "cuda/pdl.cuh"

namespace jtok::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kBM = 64, kBN = 64, kBK = 32, kWarps = 4, kThreads = 32 * kWarps;
// Shared rows: bf16 padded to 80 bytes (16-byte multiples for ldmatrix, 8 rows in distinct banks),
// fp32 to 33 words (a column's reads in distinct banks).
template <typename T>
constexpr int kLd = std::is_same_v<T, float> ? kBK + 1 : kBK + 8;
template <typename T>
constexpr size_t kSharedBytes = (kBM + kBN) * kLd<T> * sizeof(T);  // As then Bs: 10 KiB bf16, 17 KiB fp32

// bf16 staging 8 elements (16 bytes) a load: the operand's contiguous index (k when KContiguous,
// else r) in groups of 8; a group wholly inside the tile is one 16-byte load (base and stride
// 16-byte aligned: stage checks), a partial one element by element. KContiguous: 4 threads a row's
// 32 k, each group one 16-byte store (shared rows of kLd<bf16> = 40 elements: 16-byte aligned).
// Else consecutive threads take consecutive k (the outer index) of one group of 8 r, whose 8
// stores then fall in distinct shared words (a group a k would put a warp's stores in two banks).
template <bool KContiguous, int R>
__device__ void stage_vec(bf16* dst, const bf16* src, int64_t stride, int rows, int ks) {
  const int outer_n = KContiguous ? rows : ks, inner_n = KContiguous ? ks : rows;
  for (int idx = threadIdx.x; idx < R * kBK / 8; idx += kThreads) {
    // outer index (r, or k) and the group's first inner one (k, or r)
    const int o = KContiguous ? idx / (kBK / 8) : idx % kBK;
    const int i0 = KContiguous ? idx % (kBK / 8) * 8 : idx / kBK * 8;
    const bf16* at = src + o * stride + i0;
    uint4 bits = make_uint4(0, 0, 0, 0);
    bf16 v[8];
    if (o < outer_n && i0 + 8 <= inner_n) {
      bits = __ldg(reinterpret_cast<const uint4*>(at));
      memcpy(v, &bits, sizeof v);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = o < outer_n && i0 + j < inner_n ? at[j] : from_f32<bf16>(0.0f);
      memcpy(&bits, v, sizeof v);
    }
    if (KContiguous) {
      *reinterpret_cast<uint4*>(dst + o * kLd<bf16> + i0) = bits;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) dst[(i0 + j) * kLd<bf16> + o] = v[j];
    }
  }
}

// dst (R, kBK) of shared row stride kLd<T> = element (r, k) of the operand: src[r * stride + k] when
// KContiguous, else src[k * stride + r]; 0 past rows or ks. Consecutive threads read consecutive
// addresses either way; bf16 with a 16-byte aligned base and stride 16 bytes a load (stage_vec).
template <typename T, bool KContiguous, int R>
__device__ void stage(T* dst, const T* src, int64_t stride, int rows, int ks) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (stride % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0)
      return stage_vec<KContiguous, R>(dst, src, stride, rows, ks);
  }
  for (int idx = threadIdx.x; idx < R * kBK; idx += kThreads) {
    const int r = KContiguous ? idx / kBK : idx % R, k = KContiguous ? idx % kBK : idx / R;
    T v = from_f32<T>(0.0f);
    if (r < rows && k < ks) v = KContiguous ? src[r * stride + k] : src[k * stride + r];
    dst[r * kLd<T> + k] = v;
  }
}

// A block's kBM x kBN fp32 sums of A B^T from the staged tiles.
template <typename T>
struct TileSums;

// bf16: warp w holds rows 16 w .. 16 w + 15 as kBN / 8 mma C fragments (cuda/mma_bf16.cuh).
template <>
struct TileSums<bf16> {
  float c[kBN / 8][4] = {};
  __device__ void add(const bf16* As, const bf16* Bs) {
    const int warp = threadIdx.x / 32;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t a[4];
      mma::load_a(a, As, kLd<bf16>, 16 * warp, 16 * kk);
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt) mma::mma_rows_t(c[nt], a, Bs, kLd<bf16>, 8 * nt, 16 * kk);
    }
  }
  template <typename F>
  __device__ void each(F&& f) const {  // f(row, column, sum) in the tile
    const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(16 * warp + g + 8 * (e >> 1), 8 * nt + 2 * t + (e & 1), c[nt][e]);
  }
};

// fp32: thread i holds column i % kBN of rows 32 (i / kBN) .. + 31, fmaf over the sum in order.
template <>
struct TileSums<float> {
  static constexpr int kRows = kBM * kBN / kThreads;
  float c[kRows] = {};
  __device__ void add(const float* As, const float* Bs) {
    const int n = threadIdx.x % kBN, m0 = threadIdx.x / kBN * kRows;
    for (int k = 0; k < kBK; ++k) {
      const float b = Bs[n * kLd<float> + k];
#pragma unroll
      for (int i = 0; i < kRows; ++i) c[i] = fmaf(As[(m0 + i) * kLd<float> + k], b, c[i]);
    }
  }
  template <typename F>
  __device__ void each(F&& f) const {
    const int n = threadIdx.x % kBN, m0 = threadIdx.x / kBN * kRows;
#pragma unroll
    for (int i = 0; i < kRows; ++i) f(m0 + i, n, c[i]);
  }
};

// Row tile y of all experts' tiles in expert order: its expert, first grouped row and row count.
// False past the last tile.
__device__ bool expert_tile(const ExpertGroups& g, int y, int& e, int64_t& r0, int& rows) {
  int first = 0;
  for (e = 0; e < g.E; ++e) {
    const int ne = g.offsets[e + 1] - g.offsets[e], tiles = (ne + kBM - 1) / kBM;
    if (y < first + tiles) {
      const int m0 = (y - first) * kBM;
      r0 = g.offsets[e] + m0;
      rows = min(kBM, ne - m0);
      return true;
    }
    first += tiles;
  }
  return false;
}

// Forward: out (rows, N) = in (rows, K) W_e^T, W_e (N, K). Otherwise (input grad): out (rows, N) +=
// in (rows, K) W_e, W_e (K, N).
template <typename T, bool Forward>
__global__ void __launch_bounds__(kThreads)
    grouped_rows_kernel(T* out, const T* in, const T* w, ExpertGroups g, int K, int N) {
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smem_raw[];  // dynamic: ldmatrix reads it (kSharedBytes)
  T *As = reinterpret_cast<T*>(smem_raw), *Bs = As + kBM * kLd<T>;
  int e = 0, rows = 0;
  int64_t r0 = 0;
  if (!expert_tile(g, blockIdx.y, e, r0, rows)) return;
  const int n0 = blockIdx.x * kBN, cols = min(kBN, N - n0);
  const T* we = w + e * g.stride;
  TileSums<T> sums;
  for (int k0 = 0; k0 < K; k0 += kBK) {
    const int ks = min(kBK, K - k0);
    __syncthreads();  // every warp is done with the previous tiles
    stage<T, true, kBM>(As, in + r0 * K + k0, K, rows, ks);
    if (Forward) stage<T, true, kBN>(Bs, we + static_cast<int64_t>(n0) * K + k0, K, cols, ks);
    else stage<T, false, kBN>(Bs, we + static_cast<int64_t>(k0) * N + n0, N, cols, ks);
    __syncthreads();
    sums.add(As, Bs);
  }
  sums.each([&](int m, int n, float v) {
    if (m >= rows || n >= cols) return;
    T* o = out + (r0 + m) * N + n0 + n;
    *o = from_f32<T>(Forward ? v : to_f32(*o) + v);
  });
}

// dW_e (OC, C) += dy_e^T x_e over the expert's rows, kBK rows at a time in order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    grouped_weight_grad_kernel(float* dw, const T* dy, const T* x, ExpertGroups g, int C, int OC) {
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smem_raw[];  // dynamic: ldmatrix reads it (kSharedBytes)
  T *As = reinterpret_cast<T*>(smem_raw), *Bs = As + kBM * kLd<T>;
  const int e = blockIdx.z;
  const int64_t r0 = g.offsets[e];
  const int ne = g.offsets[e + 1] - g.offsets[e];
  if (ne == 0) return;
  const int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN, mrows = min(kBM, OC - m0), cols = min(kBN, C - n0);
  TileSums<T> sums;
  for (int k0 = 0; k0 < ne; k0 += kBK) {
    const int ks = min(kBK, ne - k0);
    __syncthreads();
    stage<T, false, kBM>(As, dy + (r0 + k0) * OC + m0, OC, mrows, ks);
    stage<T, false, kBN>(Bs, x + (r0 + k0) * C + n0, C, cols, ks);
    __syncthreads();
    sums.add(As, Bs);
  }
  float* de = dw + e * g.stride;
  sums.each([&](int m, int n, float v) {
    if (m < mrows && n < cols) de[static_cast<int64_t>(m0 + m) * C + n0 + n] += v;
  });
}

int tiles(int64_t n, int tile) { return static_cast<int>((n + tile - 1) / tile); }

// Blocks in y for the row products: every expert's tiles, at most rows / kBM + one partial each.
dim3 rows_grid(const ExpertGroups& g, int64_t N) { return dim3(tiles(N, kBN), tiles(g.rows, kBM) + g.E); }

void check_groups(const ExpertGroups& g, int64_t C, int64_t OC) {
  JTOK_CHECK(g.offsets && g.E > 0 && g.rows >= 0 && C > 0 && OC > 0 && g.stride >= C * OC,
             "cuda grouped linear: E ", g.E, ", rows ", g.rows, ", C ", C, ", OC ", OC, ", stride ", g.stride);
  JTOK_CHECK(tiles(g.rows, kBM) + g.E <= 65535 && g.E <= 65535 && OC <= INT32_MAX && C <= INT32_MAX,
             "cuda grouped linear: ", g.rows, " rows over ", g.E, " experts exceed the launch's grid");
}

}  // namespace

template <typename T>
void grouped_linear_forward(T* y, const T* x, const T* w, const ExpertGroups& g, int64_t C, int64_t OC,
                            cudaStream_t stream) {
  check_groups(g, C, OC);
  if (g.rows == 0) return;
  grouped_rows_kernel<T, true><<<rows_grid(g, OC), kThreads, kSharedBytes<T>, stream>>>(y, x, w, g, static_cast<int>(C),
                                                                          static_cast<int>(OC));
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename T>
void grouped_linear_backward(T* dx, float* dw, const T* dy, const T* x, const T* w, const ExpertGroups& g, int64_t C,
                             int64_t OC, cudaStream_t stream) {
  check_groups(g, C, OC);
  if (g.rows == 0) return;
  grouped_rows_kernel<T, false><<<rows_grid(g, C), kThreads, kSharedBytes<T>, stream>>>(dx, dy, w, g, static_cast<int>(OC),
                                                                          static_cast<int>(C));
  JTOK_CUDA_CHECK_LAUNCH();
  if (!dw) return;
  grouped_weight_grad_kernel<T><<<dim3(tiles(C, kBN), tiles(OC, kBM), g.E), kThreads, kSharedBytes<T>, stream>>>(
      dw, dy, x, g, static_cast<int>(C), static_cast<int>(OC));
  JTOK_CUDA_CHECK_LAUNCH();
}

#define JTOK_GROUPED_LINEAR_INSTANTIATE(T)                                                                        \
  template void grouped_linear_forward<T>(T*, const T*, const T*, const ExpertGroups&, int64_t, int64_t,          \
                                          cudaStream_t);                                                          \
  template void grouped_linear_backward<T>(T*, float*, const T*, const T*, const T*, const ExpertGroups&, int64_t, \
                                           int64_t, cudaStream_t);
JTOK_GROUPED_LINEAR_INSTANTIATE(float)
JTOK_GROUPED_LINEAR_INSTANTIATE(__nv_bfloat16)
#undef JTOK_GROUPED_LINEAR_INSTANTIATE

}  // namespace jtok::cuda
