// The row-invariant linear forward on the tensor cores (src/cuda/row_invariant_mma.h). Block b owns
// an 8-column tile (SwiGLU: gate columns 4b .. 4b+3 and their up columns); warp w of its 8 sums
// chunks k = w, w + 8, ... of 32 input elements:
//   acc = mma(A_k2, B_k2, mma(A_k1, B_k1, acc))   for each chunk k in increasing order,
// lane 4g + t holding elements 8t .. 8t+7 of the chunk: of the tile's weight row g (B) and of input
// rows r0 + g, r0 + g + 8 (A; zero past M; with a norm, each element x * rstd * gain rounded to bf16,
// rmsnorm_forward's stored value); the first product takes elements 8t .. 8t+3 (as the fragments' k
// 2t, 2t+1 and 2t+8, 2t+9), the second 8t+4 .. 8t+7. Then y = ((acc_0 + acc_1) + ...) + acc_7 over
// the warps in order, + bias, + out; SwiGLU: gate and up each rounded to Out, then swiglu_value.
// Nothing in it names M or the row's place among the rows: a row's bits are its own.
#include <climits>
#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/mma_bf16.cuh"
#include "cuda/pdl.cuh"
#include "cuda/row_invariant_mma.h"

namespace jtok::cuda {

namespace {

using bf16 = __nv_bfloat16;
constexpr int kWarps = 8, kThreads = 32 * kWarps, kCols = 8, kChunk = 32, kRows = 16;
constexpr int kAhead = 4;  // chunks a warp loads before it multiplies them

// A lane's 16 bytes at row + e, or zeros where `in` is false (row may then be null).
__device__ __forceinline__ uint4 load16(const bf16* row, int64_t e, bool in) {
  return in ? __ldg(reinterpret_cast<const uint4*>(row + e)) : make_uint4(0, 0, 0, 0);
}

// 8 input elements as rmsnorm_forward stores them: x * r * gain, rounded to bf16.
__device__ __forceinline__ uint4 normed(uint4 x, uint4 gain, float r) {
  float v[8], g[8];
  bf16x8_to_f32(v, x);
  bf16x8_to_f32(g, gain);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] =
        mma::pack(__float2bfloat16_rn(v[2 * i] * r * g[2 * i]), __float2bfloat16_rn(v[2 * i + 1] * r * g[2 * i + 1]));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// One chunk's loads: the weight row's and the two input rows' 16 bytes.
struct ChunkLoads {
  uint4 w, lo, hi;
};

// acc += the chunk's two products (elements 8t .. 8t+3, then 8t+4 .. 8t+7).
__device__ __forceinline__ void chunk_products(float (&acc)[4], const ChunkLoads& c) {
  const uint32_t a1[4] = {c.lo.x, c.hi.x, c.lo.y, c.hi.y}, a2[4] = {c.lo.z, c.hi.z, c.lo.w, c.hi.w};
  mma::mma_bf16(acc, a1, c.w.x, c.w.y);
  mma::mma_bf16(acc, a2, c.w.z, c.w.w);
}

// What a warp's sums read: the tile's weight row for this lane (null: past OC), the group's input
// rows, the norm (gain null: none) and the rows' scales.
struct Operands {
  const bf16* wrow;
  const bf16 *lo, *hi;  // null: past M
  const bf16* gain;
  float rlo, rhi;
  int64_t C;
};

// Warp w's sum over its chunks (C fragment layout: c0, c1 row g, columns 2t, 2t+1; c2, c3 row g + 8).
template <bool Norm>
__device__ void warp_sums(float (&acc)[4], const Operands& o) {
  const int warp = threadIdx.x / 32, t = threadIdx.x % 4;
  const int64_t chunks = (o.C + kChunk - 1) / kChunk;
  for (int64_t k0 = warp; k0 < chunks; k0 += kAhead * kWarps) {
    ChunkLoads c[kAhead];
    uint4 gn[kAhead];
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {  // every load of the group issued before any product
      const int64_t k = k0 + a * kWarps, e = k * kChunk + 8 * t;
      const bool in = k < chunks && e < o.C;
      c[a] = {load16(o.wrow, e, in && o.wrow), load16(o.lo, e, in && o.lo), load16(o.hi, e, in && o.hi)};
      if constexpr (Norm) gn[a] = load16(o.gain, e, in);
    }
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      if (k0 + a * kWarps >= chunks) continue;  // the same for every lane of the warp
      if constexpr (Norm) c[a].lo = normed(c[a].lo, gn[a], o.rlo), c[a].hi = normed(c[a].hi, gn[a], o.rhi);
      chunk_products(acc, c[a]);
    }
  }
}

// Rows r0 .. r0+15's RMSNorm scales into rstd (0 past M), rmsnorm_forward's own: row r0 + i by warp
// i mod 8.
__device__ void group_rstd(float (&rstd)[kRows], const bf16* inp, int64_t r0, int64_t M, int64_t C, float eps) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i < kRows; i += kWarps) {
    const float r = r0 + i < M ? warp_rms_scale(inp + (r0 + i) * C, C, eps, lane) : 0.0f;
    if (lane == 0) rstd[i] = r;
  }
  __syncthreads();
}

struct Args {
  const bf16 *inp, *weight, *gain;
  float eps;
  int64_t M, C, OC;  // SwiGLU: OC = 2F
  bool accumulate;
};

// This lane's tile weight row: plain, column 8b + g; SwiGLU, gate 4b + g (g < 4) or up F + 4b + g - 4.
template <bool Swiglu>
__device__ __forceinline__ const bf16* tile_row(const Args& a, int g) {
  const int64_t b = blockIdx.x;
  if constexpr (Swiglu) {
    const int64_t F = a.OC / 2, j = 4 * b + g % 4;
    return j < F ? a.weight + (g < 4 ? j : F + j) * a.C : nullptr;
  } else {
    const int64_t col = kCols * b + g;
    return col < a.OC ? a.weight + col * a.C : nullptr;
  }
}

// Warp 0, after every warp's fragment is in part: the outputs of rows r0 .. r0+15.
template <typename Out, bool Swiglu>
__device__ void write_tile(const float (&part)[kWarps][32][4], Out* out, const Out* bias, const Args& a, int64_t r0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const auto sum = [&](int l, int i) {
    float y = part[0][l][i];
    for (int w = 1; w < kWarps; ++w) y += part[w][l][i];
    return y;
  };
  if (Swiglu && t >= 2) return;  // the up columns: read by lane - 2
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + g + 8 * (i / 2), n = 2 * t + i % 2;
    if constexpr (Swiglu) {
      const int64_t F = a.OC / 2, col = 4 * static_cast<int64_t>(blockIdx.x) + n;
      if (r >= a.M || col >= F) continue;
      const float gate = to_f32(from_f32<Out>(sum(lane, i))), up = to_f32(from_f32<Out>(sum(lane + 2, i)));
      out[r * F + col] = from_f32<Out>(swiglu_value(gate, up));
    } else {
      const int64_t col = kCols * static_cast<int64_t>(blockIdx.x) + n;
      if (r >= a.M || col >= a.OC) continue;
      float y = sum(lane, i);
      if (bias) y += to_f32(bias[col]);
      if (a.accumulate) y = to_f32(out[r * a.OC + col]) + y;
      out[r * a.OC + col] = from_f32<Out>(y);
    }
  }
}

// grid (tiles), block 256. Norm: a.gain set.
template <typename Out, bool Swiglu, bool Norm>
__global__ void __launch_bounds__(kThreads) row_invariant_mma_kernel(Out* out, const Out* bias, Args a) {
  pdl_wait();
  __shared__ float part[kWarps][32][4];
  __shared__ float rstd[kRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  for (int64_t r0 = 0; r0 < a.M; r0 += kRows) {
    if constexpr (Norm) group_rstd(rstd, a.inp, r0, a.M, a.C, a.eps);
    const bool lo = r0 + g < a.M, hi = r0 + g + 8 < a.M;
    const Operands o{tile_row<Swiglu>(a, g),
                     lo ? a.inp + (r0 + g) * a.C : nullptr,
                     hi ? a.inp + (r0 + g + 8) * a.C : nullptr,
                     a.gain,
                     a.gain && lo ? rstd[g] : 0.0f,
                     a.gain && hi ? rstd[g + 8] : 0.0f,
                     a.C};
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    warp_sums<Norm>(acc, o);
    for (int i = 0; i < 4; ++i) part[warp][lane][i] = acc[i];
    __syncthreads();
    if (warp == 0) write_tile<Out, Swiglu>(part, out, bias, a, r0);
    __syncthreads();  // part and rstd are rewritten by the next group of rows
  }
}

void check_operands(const char* who, const bf16* inp, const bf16* weight, const bf16* gain, int64_t M, int64_t C,
                    int64_t OC) {
  if (M < 0 || C < 1 || OC < 1 || (OC + kCols - 1) / kCols > INT_MAX)
    fail("cuda ", who, ": bad shape M ", M, " C ", C, " OC ", OC);
  if (!mma_loads(inp, weight, gain, C))
    fail("cuda ", who, ": C (", C, ") must be a multiple of 8 and the input, weight and norm 16-byte aligned");
}

// The kernel with or without the norm (its loads and registers only where it is asked for).
template <typename Out, bool Swiglu>
void launch(unsigned blocks, Out* out, const Out* bias, const Args& a, cudaStream_t stream) {
  if (a.gain)
    row_invariant_mma_kernel<Out, Swiglu, true><<<blocks, kThreads, 0, stream>>>(out, bias, a);
  else
    row_invariant_mma_kernel<Out, Swiglu, false><<<blocks, kThreads, 0, stream>>>(out, bias, a);
  JTOK_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool mma_loads(const void* inp, const void* weight, const void* gain, int64_t C) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return C % 8 == 0 && aligned(inp) && aligned(weight) && aligned(gain);
}

template <typename In, typename Out>
void row_invariant_product(bool tensor_cores, Out* out, const In* inp, const In* weight, const Out* bias, int64_t M,
                           int64_t C, int64_t OC, bool accumulate, cudaStream_t stream, const RowNorm<In>& norm) {
  if constexpr (std::is_same_v<In, bf16>) {
    if (tensor_cores && mma_loads(inp, weight, norm.gain, C))
      return row_invariant_linear_mma<Out>(out, inp, weight, bias, M, C, OC, accumulate, stream, norm);
  }
  row_invariant_linear<In, Out>(out, inp, weight, bias, M, C, OC, accumulate, stream, norm);
}

template <typename T>
void row_invariant_swiglu_product(bool tensor_cores, T* out, const T* inp, const T* weight, int64_t M, int64_t C,
                                  int64_t F, cudaStream_t stream, const RowNorm<T>& norm) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (tensor_cores && mma_loads(inp, weight, norm.gain, C))
      return row_invariant_swiglu_mma(out, inp, weight, M, C, F, stream, norm);
  }
  row_invariant_swiglu<T>(out, inp, weight, M, C, F, stream, norm);
}

template <typename Out>
void row_invariant_linear_mma(Out* out, const bf16* inp, const bf16* weight, const Out* bias, int64_t M, int64_t C,
                              int64_t OC, bool accumulate, cudaStream_t stream, const RowNorm<bf16>& norm) {
  check_operands("row_invariant_linear_mma", inp, weight, norm.gain, M, C, OC);
  if (M == 0) return;
  const auto blocks = static_cast<unsigned>((OC + kCols - 1) / kCols);
  launch<Out, false>(blocks, out, bias, {inp, weight, norm.gain, norm.eps, M, C, OC, accumulate}, stream);
}

void row_invariant_swiglu_mma(bf16* out, const bf16* inp, const bf16* weight, int64_t M, int64_t C, int64_t F,
                              cudaStream_t stream, const RowNorm<bf16>& norm) {
  check_operands("row_invariant_swiglu_mma", inp, weight, norm.gain, M, C, 2 * F);
  if (M == 0) return;
  const auto blocks = static_cast<unsigned>((F + 3) / 4);
  launch<bf16, true>(blocks, out, nullptr, {inp, weight, norm.gain, norm.eps, M, C, 2 * F, false}, stream);
}

template void row_invariant_linear_mma<bf16>(bf16*, const bf16*, const bf16*, const bf16*, int64_t, int64_t, int64_t,
                                             bool, cudaStream_t, const RowNorm<bf16>&);
template void row_invariant_linear_mma<float>(float*, const bf16*, const bf16*, const float*, int64_t, int64_t, int64_t,
                                              bool, cudaStream_t, const RowNorm<bf16>&);

#define JTOK_ROW_INVARIANT_PRODUCT(In, Out)                                                                    \
  template void row_invariant_product<In, Out>(bool, Out*, const In*, const In*, const Out*, int64_t, int64_t, \
                                               int64_t, bool, cudaStream_t, const RowNorm<In>&);
JTOK_ROW_INVARIANT_PRODUCT(float, float)
JTOK_ROW_INVARIANT_PRODUCT(bf16, bf16)
JTOK_ROW_INVARIANT_PRODUCT(bf16, float)
template void row_invariant_swiglu_product<float>(bool, float*, const float*, const float*, int64_t, int64_t, int64_t,
                                                  cudaStream_t, const RowNorm<float>&);
template void row_invariant_swiglu_product<bf16>(bool, bf16*, const bf16*, const bf16*, int64_t, int64_t, int64_t,
                                                 cudaStream_t, const RowNorm<bf16>&);

}  // namespace jtok::cuda
