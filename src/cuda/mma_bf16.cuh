// Device helpers for bf16 tensor-core tiles (mma.sync m16n8k16, fp32 accumulate), internal to
// src/cuda (the attention kernels). Fragment layouts (PTX ISA, "Matrix fragments for
// mma.m16n8k16"), lane = 4 g + t:
//   A (16x16, row): a0 (row g, cols 2t, 2t+1), a1 (row g+8, same), a2 (row g, cols 2t+8, 2t+9), a3
//     (row g+8, same); B (16x8, col): b0 (rows 2t, 2t+1 of column g), b1 (rows 2t+8, 2t+9);
//   C (16x8): c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, same). The lower column (row) of a
//   pair sits in the lower half of its 32-bit register.
// So the C fragments of a 16 x 16 block (two n-tiles) are the A fragment of the next product
// (FlashAttention-2's trick): a_from_c.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common.cuh"

namespace jtok::cuda::mma {

using bf16 = __nv_bfloat16;

template <int HD>
constexpr int kRowStride = HD + 8;

// The softmax runs in base 2 (exp2f is one special-function instruction; expf is several): scores
// scaled by scale * log2(e), lse converted at the boundary, where it is natural as on the CPU.
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;  // padded shared-memory row, in elements (a 16-byte multiple)

__device__ inline void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two bf16 from anywhere, lo in the lower half.
__device__ inline uint32_t pack(bf16 lo, bf16 hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) | (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
}
__device__ inline uint32_t pack(float lo, float hi) { return f32x2_to_bf16x2(lo, hi); }

// ldmatrix (PTX ISA, "Warp-level matrix load instruction: ldmatrix"): lanes 8i .. 8i+7 give the
// row addresses of 8 x 8 matrix i (16 bytes a row, 16-byte aligned; .x2 reads lanes 0-15 only);
// lane 4g + t receives in register i row g's elements 2t, 2t+1 of matrix i, or with .trans column
// g's elements 2t, 2t+1: the mma fragment layouts above, one instruction for 2 or 4 registers.
__device__ inline uint32_t smem_address(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ inline void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(smem_address(p)));
}
__device__ inline void ldmatrix_x2_trans(uint32_t& r0, uint32_t& r1, const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(smem_address(p)));
}

// The A fragment of rows [row0, row0 + 16) x cols [col0, col0 + 16) of a row-major shared tile (row
// stride ld): matrices (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (0-7, 8-15), (8-15, 8-15) = a0..a3.
__device__ inline void load_a(uint32_t (&a)[4], const bf16* tile, int ld, int row0, int col0) {
  const int lane = threadIdx.x % 32, i = lane / 8;
  ldmatrix_x4(a, tile + (row0 + lane % 8 + 8 * (i & 1)) * ld + col0 + 8 * (i >> 1));
}

// C fragments c0 (cols 0-7) and c1 (cols 8-15) of a 16 x 16 block as an A fragment, rounded to bf16.
__device__ inline void a_from_c(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack(c0[0], c0[1]);
  a[1] = pack(c0[2], c0[3]);
  a[2] = pack(c1[0], c1[1]);
  a[3] = pack(c1[2], c1[3]);
}

// The B operand of A . M[rows n0 .. n0+8)^T over k [k0, k0 + 16), M a row-major shared tile (row
// stride ld) whose rows are the output columns (keys for q k^T): b0, b1 are matrices (rows n0.., cols
// k0..) and (rows n0.., cols k0+8..).
__device__ inline void load_b_rows_t(uint32_t& b0, uint32_t& b1, const bf16* M, int ld, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x2(b0, b1, M + (n0 + lane % 8) * ld + k0 + 8 * ((lane / 8) & 1));
}
// c += A . M[rows n0 .. n0+8)^T over k [k0, k0 + 16) (the operand above).
__device__ inline void mma_rows_t(float (&c)[4], const uint32_t (&a)[4], const bf16* M, int ld, int n0, int k0) {
  uint32_t b0, b1;
  load_b_rows_t(b0, b1, M, ld, n0, k0);
  mma_bf16(c, a, b0, b1);
}

// The B operand of A . M[k0 .. k0+16, n0 .. n0+8), M a row-major shared tile (row stride ld) whose
// rows are the sum's index (keys for P v): b0, b1 are matrices (rows k0.., cols n0..) and (rows
// k0+8.., cols n0..), transposed.
__device__ inline void load_b_rows(uint32_t& b0, uint32_t& b1, const bf16* M, int ld, int k0, int n0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x2_trans(b0, b1, M + (k0 + lane % 8 + 8 * ((lane / 8) & 1)) * ld + n0);
}

// acc[mt] (16 x HD, as HD / 8 C fragments) += X[mt] (16 x N, C fragments, rounded to bf16) M (N x HD,
// row-major shared tile, row stride kRowStride<HD>), for a warp's MT m16 tiles of rows: each fragment of
// M is loaded once for the MT products (P V in the forward, dS K, P^T dO and dS^T Q in the backward).
// Per tile the products run in the order of one.
template <int HD, int N, int MT>
__device__ void accumulate_tiles(float (&acc)[MT][HD / 8][4], const float (&x)[MT][N / 8][4], const bf16* M) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) a_from_c(a[mt], x[mt][2 * kk], x[mt][2 * kk + 1]);
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
      uint32_t b0, b1;  // rows 16 kk.., columns 8 nt..
      load_b_rows(b0, b1, M, kRowStride<HD>, 16 * kk, 8 * nt);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) mma_bf16(acc[mt][nt], a[mt], b0, b1);
    }
  }
}

// cp.async (PTX ISA, "cp.async", sm_80+): 16 bytes global -> shared without a trip through registers,
// so the next tile's loads run while this one's products do. Copies join the thread's current group;
// commit closes it; wait<N> returns once all but the newest N committed groups have landed (this
// thread's copies: a __syncthreads after it makes every thread's visible). src_bytes below the copy's
// size (16 bytes, or one float: cp_async_4) reads that many and zero-fills the rest (0: a row past
// the end, src any valid address).
__device__ inline void cp_async_16(bf16* dst, const bf16* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], %2, %3;\n"
               :
               : "r"(smem_address(dst)), "l"(src), "n"(16), "r"(src_bytes)
               : "memory");
}
__device__ inline void cp_async_4(float* dst, const float* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
               :
               : "r"(smem_address(dst)), "l"(src), "n"(4), "r"(src_bytes)
               : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" : : : "memory"); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" : : "n"(N) : "memory");
}

// dst (rows, HD), row stride kRowStride<HD> = rows [r0, r0 + rows) of src (row stride ld elements;
// src 16-byte aligned, ld a multiple of 8), zero past T; 16 bytes a cp.async by all threads of the
// block, into their open group.
template <int HD, int Threads>
__device__ void load_tile_async(bf16* dst, const bf16* src, int64_t ld, int r0, int rows, int T) {
  constexpr int chunks = HD / 8;
  for (int idx = threadIdx.x; idx < rows * chunks; idx += Threads) {
    const int r = idx / chunks, c = idx % chunks;
    const bool in = r0 + r < T;
    cp_async_16(dst + r * kRowStride<HD> + c * 8, src + static_cast<int64_t>(in ? r0 + r : 0) * ld + c * 8,
                in ? 16 : 0);
  }
}

// A stage of keys [c0, c0 + keys): K's rows, then V's right after them (both row stride ld).
template <int HD, int Threads>
__device__ void load_kv_async(bf16* stage, const bf16* k, const bf16* v, int64_t ld, int c0, int keys, int T) {
  load_tile_async<HD, Threads>(stage, k, ld, c0, keys, T);
  load_tile_async<HD, Threads>(stage + keys * kRowStride<HD>, v, ld, c0, keys, T);
}

// row (bf16, 2 elements at col, 4-byte aligned) += scale * (c_lo, c_hi), rounded once; without
// accumulate, from zero (row not read: the bits of zeroing it first).
__device__ inline void add_pair(bf16* row, float scale, float c_lo, float c_hi, bool accumulate = true) {
  float lo = 0.0f, hi = 0.0f;
  if (accumulate) {
    const __nv_bfloat162 old = *reinterpret_cast<const __nv_bfloat162*>(row);
    lo = __low2float(old), hi = __high2float(old);
  }
  *reinterpret_cast<uint32_t*>(row) = pack(lo + scale * c_lo, hi + scale * c_hi);
}

}  // namespace jtok::cuda::mma
