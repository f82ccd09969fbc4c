// Products of many input rows (prefill, evaluation, batched serving) with low-precision weights, on
// the CPU's own low-precision arithmetic, without converting the weights (oneDNN's matmul primitive,
// one per shape, made on first use and cached):
//   bf16 weights: the input rounded to bf16 (nearest even, quantize_bf16_rows), bf16 x bf16
//                 products summed in fp32 (vdpbf16ps).
//   int8 weights: the input quantised with one scale per row (quantize_act_rows_q8), int8 x int8
//                 products summed exactly in int32 (vpdpbusd), times the input row's scale and the
//                 weight row's scale. One scale per row, not per block of 32 as the per-row decode
//                 kernels: a plain int8 GEMM (per-block scales need a partial sum per block, out of
//                 the library's reach); its error on model activations is measured in
//                 tests/test_lowp.cpp (LowpGemm.Int8ErrorAgainstFp32) and docs/benchmarks.md.
// Only on CPUs with AVX-512 BF16 (bf16) or AVX-512 VNNI (int8), unless JTOK_LOWP_GEMM=off:
// lowp_gemm_enabled; elsewhere linear_forward_lowp keeps converting panels of weights to fp32 for
// sgemm.
#pragma once
#include <cstdint>

#include "ops/lowp_linear.h"

namespace jtok {

// linear_forward_lowp runs lowp_gemm for many rows of dtype t: the CPU has the instructions (bf16:
// AVX-512 BF16; int8: AVX-512 VNNI) and JTOK_LOWP_GEMM is not "off". From the flags alone, never
// timed: a host always runs the same kernels.
bool lowp_gemm_enabled(Dtype t);

// out (N, OC) (+)= inp (N, C) @ W^T for W = w (OC, C), bf16 or int8; with accumulate, out +=.
void lowp_gemm(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate);

// x (N, C) to int8 with one scale per row: scale[n] = max|x[n,:]| / 127, as quantize_int8_span.
void quantize_act_rows_q8(int8_t* q, float* scale, const float* x, int64_t N, int64_t C);

// x (N, C) as lowp_gemm multiplies it for weights of dtype t, in fp32 (the reference's input):
// rounded to bf16, or quantised per row and multiplied back by the row's scale.
void lowp_gemm_input_ref(float* out, const float* x, Dtype t, int64_t N, int64_t C);

// Which kernels compute the product: for the start-up line and the benches.
const char* lowp_gemm_kernel_name(Dtype t);

}  // namespace jtok
