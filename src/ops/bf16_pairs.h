// Small bf16 products on pairs, for the blocks of mixed-precision attention (ops/attention_bf16.cpp).
// AVX-512 BF16's vdpbf16ps multiplies pairs of bf16 values: lane i of the result gains
// a[2i] b[2i] + a[2i+1] b[2i+1] in fp32. So a product's operands are stored as pairs along the
// contraction: one uint32 holds two bf16 values, the lower 16 bits the first (k = 2p), the upper
// the second (k = 2p + 1); a missing second value (an odd contraction length) is 0.
// oneDNN's matmul primitive costs microseconds per call to set up, which the thousands of 64-row
// blocks of one attention layer cannot afford, so these blocks run on tiles of our own.
#pragma once
#include <cstdint>

namespace jtok {

// C (M,N) = alpha * sum_p A(m,p) . B(p,n) + beta * C, beta 0 or 1, over Pn pairs, in fp32.
// A(m,p) is at A[m * a_row + p * a_pair] (pairs along a row: a_pair 1; pairs packed by
// pack_row_pairs and read transposed: a_row 1); B(p,n) at B[p * ldb + n]; C has row stride ldc.
void gemm_bf16_pairs(int64_t M, int64_t N, int64_t Pn, float alpha, const uint32_t* A, int64_t a_row, int64_t a_pair,
                     const uint32_t* B, int64_t ldb, float beta, float* C, int64_t ldc);
// The plain reference: each pair's two products summed in double, then over p, in order.
void gemm_bf16_pairs_ref(int64_t M, int64_t N, int64_t Pn, float alpha, const uint32_t* A, int64_t a_row,
                         int64_t a_pair, const uint32_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Packers from fp32 (row stride ld), rounding to bf16 to nearest even (f32_to_bf16):
// rows of x (rows, cols) as pairs along the row: dst (rows, ceil(cols / 2)), compact.
void pack_pairs_along_rows(uint32_t* dst, const float* x, int64_t rows, int64_t cols, int64_t ld);
// rows 2p and 2p+1 of x (rows, cols) interleaved: dst (ceil(rows / 2), cols) with row stride ldd,
// dst[p * ldd + c] = (x[2p][c], x[2p+1][c]).
void pack_row_pairs(uint32_t* dst, int64_t ldd, const float* x, int64_t rows, int64_t cols, int64_t ld);
// x (rows, cols) transposed, pairs along each row of x: dst (ceil(cols / 2), rows) with row stride
// ldd, dst[p * ldd + r] = (x[r][2p], x[r][2p+1]).
void pack_transposed_pairs(uint32_t* dst, int64_t ldd, const float* x, int64_t rows, int64_t cols, int64_t ld);

}  // namespace jtok
