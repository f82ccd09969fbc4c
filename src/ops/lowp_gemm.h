// Products of many input rows (prefill, evaluation, batched serving) with low-precision weights, on
// the CPU's own low-precision arithmetic, without converting the weights to fp32:
//   bf16 weights: oneDNN's matmul primitive, one per shape, made on first use and cached.
//                 The input rounded to bf16 (nearest even, quantize_bf16_rows), bf16 x bf16
//                 products summed in fp32 (vdpbf16ps).
//   int8 weights: the input quantised per block of 32 values (quantize_act_q8, as the per-row
//                 decode kernels and llama.cpp's Q8_0), int8 x int8 products summed exactly in
//                 int32 per block (vpdpbusd with AVX-512 VNNI; vpmaddubsw + vpmaddwd with AVX2),
//                 times the block's input scale, summed in fp32, times the weight row's scale:
//                 ops/q8_gemm.h, tiles of our own (a library int8 GEMM has one input scale per row,
//                 which doubles the product's error on model activations: tests/test_lowp.cpp,
//                 LowpGemm.Int8ErrorAgainstFp32).
// bf16 only on CPUs with AVX-512 BF16, int8 on CPUs with AVX-512 VNNI or AVX2 (q8_kernels(),
// JTOK_LOWP_KERNELS), unless JTOK_LOWP_GEMM=off: lowp_gemm_enabled; elsewhere linear_forward_lowp
// keeps converting panels of weights to fp32 for sgemm.
#pragma once
#include <cstdint>
#include <string>

#include "ops/lowp_linear.h"

namespace jtok {

// linear_forward_lowp runs lowp_gemm for many rows of dtype t: the CPU has the instructions (bf16:
// AVX-512 BF16; int8: q8_kernels() is vnni or avx2) and JTOK_LOWP_GEMM is not "off". From the flags
// alone (or JTOK_LOWP_KERNELS), never timed: a host always runs the same kernels.
bool lowp_gemm_enabled(Dtype t);

// out (N, OC) (+)= inp (N, C) @ W^T for W = w (OC, C), bf16 or int8; with accumulate, out +=.
void lowp_gemm(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate);

// x (N, C) as lowp_gemm multiplies it for weights of dtype t, in fp32 (the reference's input):
// rounded to bf16, or quantised per block of 32 and multiplied back by the block's scale.
void lowp_gemm_input_ref(float* out, const float* x, Dtype t, int64_t N, int64_t C);

// Which kernels compute the product: for the start-up line and the benches.
const char* lowp_gemm_kernel_name(Dtype t);

// The start-up line of a model with dtype-t weights of `cols` columns: which kernels run up to how
// many rows and past it, e.g. "int8 weights: up to 8 rows (and every decoding step) 4-row register
// tiles, ...; more rows int8 x int8 tiles, ...".
std::string lowp_kernels_line(Dtype t, int64_t cols);

}  // namespace jtok
