// Inference-only linear layers with low-precision weights: y = x W^T with W stored as bf16 or as
// int8 with one fp32 scale per output row (symmetric: W[o,c] ~ scale[o] * q[o,c], q in [-127,127];
// the matrix and its conversions: ops/lowp_convert.h).
// Accumulation and outputs stay fp32.
//   bf16: weight-only (activations fp32) in the per-row kernels; bf16 x bf16 in lowp_gemm.
//   int8: W8A8. The per-row kernels, as llama.cpp's Q8_0 x Q8_0 dot product: each input row is
//         quantised per block of kActBlock = 32 values (scale amax/127, round to nearest, quantize_act_q8) and the product is
//         sum over blocks of (exact int32 dot of the int8 values) * activation scale, times the
//         weight row's scale. The per-row kernels, lowp_gemm and panels + sgemm multiply these same
//         quantised inputs, so they differ only in fp32 summation order.
//
// The fast path: for a few rows (decoding, N <= kLowpGemvRows; N <= 8 where lowp_gemm runs; with
// AVX-512 but not it, bf16 N <= 24 and int8 N <= 48 (vnni): the measured crossovers; f32 N <= 4) each thread
// streams its own contiguous stretch of weight rows through a register tile (4 weight rows x up to 4
// inputs, the rows read one after the other up to 2 inputs (int8: 3), interleaved beyond: the same
// bits either way; bf16 converted in registers, int8 by vpdpbusd where the int8 kernels are vnni (ops/q8_gemm.h), C % 64 == 0;
// without AVX-512, an AVX2 tile of 4 weight rows x 2 inputs for f32 and bf16, C % 8 == 0),
// several matrices of one input in one parallel region (linear_forward_lowp_multi: q/k/v, gate/up).
// For more rows (prefill; N > 8 here) on a CPU with AVX-512 BF16 (bf16) or AVX-512 VNNI or AVX2
// (int8: q8_kernels()), the products of ops/lowp_gemm.h: bf16 x bf16 (the input rounded to bf16)
// and int8 x int8 (the input quantised per block of 32, as here), on the stored weights. Elsewhere it converts a panel of weight rows to
// fp32 and hands it to sgemm (f32: sgemm directly), the conversion being O(OC*C) against the
// product's O(N*OC*C). The reference
// converts the whole matrix (and, for int8, the quantised input) and runs the double-accumulating
// linear_forward_ref.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/lowp_convert.h"

namespace jtok {

constexpr int64_t kLowpGemvRows = 16;

// Which kernels may compute N input rows. fastest: the register tile for few rows, sgemm for many,
// so a row's bits may depend on N (the kernels sum in different orders). per_row: every row by the
// register tile (or, without AVX-512, the portable dot products) whatever N, each row's sums in one
// order: decoding, whose rows are independent sequences, so that a sequence's logits have the same
// bits whichever other sequences share the step (a greedy reply does not depend on the server's load).
enum class RowKernel { fastest, per_row };

// out (N, OC) = inp (N, C) @ W^T for W (OC, C) = w (w.rows == OC, w.cols == C); with accumulate,
// out += instead of =.
void linear_forward_lowp(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate = false,
                         RowKernel rk = RowKernel::fastest);
// Several products of the same input (q, k, v; gate, up): outs[i].out (N, outs[i].w.rows) (+)=
// inp @ outs[i].w^T, all matrices with the same number of columns. With few rows, one parallel
// region for all of them (the int8 input quantised once); the same values as one call each.
struct LinearOut {
  float* out;
  WeightMatrix w;
  bool accumulate = false;
};
void linear_forward_lowp_multi(const LinearOut* outs, int n, const float* inp, int64_t N,
                               RowKernel rk = RowKernel::fastest);
// Under RowKernel::fastest, products of at most this many rows with w take the per-row kernels
// (decoding always does), more rows the many-row products; the kernels' names, for the start-up
// line (lowp_kernels_line in ops/lowp_gemm.h).
int64_t lowp_gemv_max_rows(const WeightMatrix& w);
const char* lowp_per_row_kernel_name(Dtype t, int64_t cols);
// The reference: the whole matrix converted to fp32, the double-accumulating linear_forward_ref, on
// the input the fast path multiplies for this N and rk (fp32; int8: quantised per block of 32;
// bf16 where many rows run lowp_gemm: rounded to bf16).
void linear_forward_lowp_ref(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate = false,
                             RowKernel rk = RowKernel::per_row);

}  // namespace jtok
