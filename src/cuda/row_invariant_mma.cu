// The row-invariant linear forward on the tensor cores (src/cuda/row_invariant_mma.h). Block b owns
// columns [8b, 8b + 8); warp w of its 8 sums chunks k = w, w + 8, ... of 32 input elements:
//   acc = mma(A_k2, B_k2, mma(A_k1, B_k1, acc))   for each chunk k in increasing order,
// lane 4g + t holding elements 8t .. 8t+7 of the chunk: of weight row 8b + g (B) and of input rows
// r0 + g, r0 + g + 8 (A; zero past M); the first product takes elements 8t .. 8t+3 (as the
// fragments' k 2t, 2t+1 and 2t+8, 2t+9), the second 8t+4 .. 8t+7. Then y = ((acc_0 + acc_1) + ...) +
// acc_7 over the warps in order, + bias, + out. Nothing in it names M or the row's place among the
// rows: a row's bits are its own.
#include <climits>
#include <cstdint>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/mma_bf16.cuh"
#include "cuda/pdl.cuh"
#include "cuda/row_invariant_mma.h"

namespace jtok::cuda {

namespace {

using bf16 = __nv_bfloat16;
constexpr int kWarps = 8, kThreads = 32 * kWarps, kCols = 8, kChunk = 32;
constexpr int kAhead = 4;  // chunks a warp loads before it multiplies them

// A lane's 16 bytes at p, or zeros where `in` is false.
__device__ __forceinline__ uint4 load16(const bf16* p, bool in) {
  return in ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
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

// Warp w's sum over its chunks for rows r0 .. r0+15 and the block's 8 columns (C fragment layout).
__device__ void warp_sums(float (&acc)[4], const bf16* inp, const bf16* weight, int64_t r0, int64_t M, int64_t C,
                          int64_t OC, int64_t col0) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t chunks = (C + kChunk - 1) / kChunk, col = col0 + g;
  const bf16* wrow = weight + (col < OC ? col : 0) * C;
  const bf16* lo = inp + (r0 + g < M ? r0 + g : 0) * C;
  const bf16* hi = inp + (r0 + g + 8 < M ? r0 + g + 8 : 0) * C;
  const bool wok = col < OC, lok = r0 + g < M, hok = r0 + g + 8 < M;
  for (int64_t k0 = warp; k0 < chunks; k0 += kAhead * kWarps) {
    ChunkLoads c[kAhead];
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {  // every load of the group issued before any product
      const int64_t k = k0 + a * kWarps, e = k * kChunk + 8 * t;
      const bool in = k < chunks && e < C;
      c[a] = {load16(wrow + e, in && wok), load16(lo + e, in && lok), load16(hi + e, in && hok)};
    }
#pragma unroll
    for (int a = 0; a < kAhead; ++a)
      if (k0 + a * kWarps < chunks) chunk_products(acc, c[a]);  // the same for every lane of the warp
  }
}

// grid (ceil(OC / 8)), block 256: out rows < M, columns [8 b, 8 b + 8).
template <typename Out>
__global__ void __launch_bounds__(kThreads)
    row_invariant_mma_kernel(Out* out, const bf16* inp, const bf16* weight, const Out* bias, int64_t M, int64_t C,
                             int64_t OC, bool accumulate) {
  pdl_wait();
  __shared__ float part[kWarps][32][4];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kCols;
  for (int64_t r0 = 0; r0 < M; r0 += 16) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    warp_sums(acc, inp, weight, r0, M, C, OC, col0);
    for (int i = 0; i < 4; ++i) part[warp][lane][i] = acc[i];
    __syncthreads();
    if (warp == 0) {
      for (int i = 0; i < 4; ++i) {  // c0, c1: row g, columns 2t, 2t+1; c2, c3: row g + 8
        const int64_t r = r0 + g + 8 * (i / 2), col = col0 + 2 * t + i % 2;
        float y = part[0][lane][i];
        for (int w = 1; w < kWarps; ++w) y += part[w][lane][i];
        if (r >= M || col >= OC) continue;
        if (bias) y += to_f32(bias[col]);
        if (accumulate) y = to_f32(out[r * OC + col]) + y;
        out[r * OC + col] = from_f32<Out>(y);
      }
    }
    __syncthreads();  // part is rewritten by the next group of rows
  }
}

}  // namespace

template <typename Out>
void row_invariant_linear_mma(Out* out, const bf16* inp, const bf16* weight, const Out* bias, int64_t M, int64_t C,
                              int64_t OC, bool accumulate, cudaStream_t stream) {
  if (M < 0 || C < 1 || OC < 1 || (OC + kCols - 1) / kCols > INT_MAX)
    fail("cuda row_invariant_linear_mma: bad shape M ", M, " C ", C, " OC ", OC);
  if (C % 8 != 0 || reinterpret_cast<uintptr_t>(inp) % 16 != 0 || reinterpret_cast<uintptr_t>(weight) % 16 != 0)
    fail("cuda row_invariant_linear_mma: C (", C, ") must be a multiple of 8 and the input and weight 16-byte aligned");
  if (M == 0) return;
  const auto blocks = static_cast<unsigned>((OC + kCols - 1) / kCols);
  row_invariant_mma_kernel<Out><<<blocks, kThreads, 0, stream>>>(out, inp, weight, bias, M, C, OC, accumulate);
  JTOK_CUDA_CHECK_LAUNCH();
}

template void row_invariant_linear_mma<bf16>(bf16*, const bf16*, const bf16*, const bf16*, int64_t, int64_t, int64_t,
                                             bool, cudaStream_t);
template void row_invariant_linear_mma<float>(float*, const bf16*, const bf16*, const float*, int64_t, int64_t, int64_t,
                                              bool, cudaStream_t);

}  // namespace jtok::cuda
