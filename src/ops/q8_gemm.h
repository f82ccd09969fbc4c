// int8 x int8 products of many input rows (prefill, evaluation, batched serving) with the input
// quantised as the per-row decode kernels and llama.cpp's Q8_0 x Q8_0 quantise it: one scale per
// block of 32 values (quantize_act_q8), the weights with one scale per output row.
//   out[n, o] = wscale[o] * sum over blocks b of xscale[n, b] * (exact int32 sum over the block of
//               xq[n, c] * wq[o, c])
// Each block's int32 sum is converted to fp32 and added as fma(sum, xscale, acc) in block order,
// then out = acc * wscale (accumulating: fma(acc, wscale, out)), in both vector kernels, so they
// give the same bits (the int32 sums are exact in each):
//   vnni: a tile of 6 input rows x 32 output rows, vpdpbusd on the input shifted to unsigned (+128,
//         taken back by starting each block's int32 sums at -128 * the block's weight sum). The
//         weights are packed per panel of 32 rows on the fly (vpdpbusd's layout: 16 rows x 4
//         columns per vector), O(OC*C) against the product's O(N*OC*C).
//   avx2: a tile of 4 input rows x 8 output rows (ops/q8_gemm_avx2.h), vpmaddubsw on |w| and the
//         input with w's sign, vpmaddwd into int32; the weights packed per panel of 8 rows (8 rows
//         x 4 columns per vector).
//   fallback: plain loops (for tests; linear_forward_lowp converts weight panels for sgemm instead).
#pragma once
#include <cstdint>

#include "ops/lowp_convert.h"

namespace jtok {

// The int8 kernels of the process: the per-row ones (RowKernel, ops/lowp_linear.h) and, past the
// crossover, q8_gemm's. vnni: AVX-512 VNNI in the build and the CPU; avx2: AVX2 + FMA in the CPU
// (compiled for it whatever the build flags); fallback: neither (portable per-row loops, weight
// panels converted to fp32 for sgemm).
enum class Q8Kernels { vnni, avx2, fallback };
const char* q8_kernels_name(Q8Kernels k);  // "vnni", "avx2", "fallback"
bool q8_kernels_available(Q8Kernels k);
// The kernels in use: set_q8_kernels's, else JTOK_LOWP_KERNELS=vnni|avx2|fallback (read once; an
// unknown or unavailable value is an error naming it), else the first available of vnni, avx2.
Q8Kernels q8_kernels();
// For tests and benches (every path checked on one host): the kernels of every later product.
void set_q8_kernels(Q8Kernels k);
// value ("vnni", "avx2" or "fallback") as kernels available here; else an error naming what
// (e.g. "JTOK_LOWP_KERNELS") and value.
Q8Kernels parse_q8_kernels(const char* value, const char* what);

// out (N, OC) (+)= inp (N, C) quantised per block of 32 @ W^T for int8 W = w (OC, C); with
// accumulate, out +=. With the kernels in use, or k (available on this CPU).
void q8_gemm(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate);
void q8_gemm(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate, Q8Kernels k);

// Whether this build has q8_gemm's vpdpbusd tiles (compiled with AVX-512 VNNI).
bool q8_gemm_vnni();

}  // namespace jtok
