// int8 x int8 products of many input rows (prefill, evaluation, batched serving) with the input
// quantised as the per-row decode kernels and llama.cpp's Q8_0 x Q8_0 quantise it: one scale per
// block of 32 values (quantize_act_q8), the weights with one scale per output row.
//   out[n, o] = wscale[o] * sum over blocks b of xscale[n, b] * (exact int32 sum over the block of
//               xq[n, c] * wq[o, c])
// The fast kernel (AVX-512 VNNI): a tile of 6 input rows x 32 output rows, vpdpbusd on the input
// shifted to unsigned (+128, taken back by starting each block's int32 sums at -128 * the block's
// weight sum), the block's sums converted and multiplied by its input scale into fp32
// accumulators. The weights are packed per panel of 32 rows on the fly (vpdpbusd's layout: 16 rows
// x 4 columns per vector), O(OC*C) against the product's O(N*OC*C). Without VNNI, plain loops with
// the same integer sums (for tests on such hosts; linear_forward_lowp does not call it there).
#pragma once
#include <cstdint>

#include "ops/lowp_linear.h"

namespace jtok {

// out (N, OC) (+)= inp (N, C) quantised per block of 32 @ W^T for int8 W = w (OC, C); with
// accumulate, out +=.
void q8_gemm(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate);

// Whether q8_gemm runs its vpdpbusd tiles in this build (compiled with AVX-512 VNNI).
bool q8_gemm_vnni();

}  // namespace jtok
