// row_invariant_linear's contract (cuda/row_invariant_linear.h) on the tensor cores, bf16 inputs and
// weights, fp32 accumulation (issue 40's batch-16 decode goal). On the CUDA cores a decode step of
// 16 rows is 16 fp32 FMAs a weight, about 9.5 G for a Qwen3-0.6B step (0.28 ms at an H100's 67
// TFLOP/s fp32 peak, which no such kernel reaches); mma.sync m16n8k16 does 16 rows x 8 columns x 16
// elements in one warp instruction, so a step's products stay weight streaming up to 16 rows.
//
// How (row_invariant_mma.cu): a block of 8 warps owns 8 output columns (an n8 tile; SwiGLU: 4 gate
// columns and their 4 up columns); the input's C
// elements split into chunks of 32, chunk k summed by warp k mod 8 into its own fp32 accumulator
// fragment by two mma.sync a chunk, its chunks in increasing order; then the 8 warps' fragments
// summed in warp order, + bias, + out (accumulate). The rows go through in groups of 16, rows past M
// zero. A lane loads 16 bytes of a weight row and of two input rows a chunk (16-byte aligned rows:
// C a multiple of 8), and the chunk's 32 elements enter the two products in an order both operands
// share (lane 4 g + t's 8 elements 8t .. 8t+7 as the fragments' k 2t, 2t+1, 2t+8, 2t+9 of the first
// product, then of the second), so every element is multiplied by its own weight once.
//
// Every output element's bits depend only on its input row, the weight row, the bias and C: a row's
// products are its own (a tensor core's output element is a function of its row of A and its column
// of B alone), the chunks, their warps and the warps' order are fixed by C. They are not
// row_invariant_linear's bits (another order of sums); a decoder takes one or the other for all its
// decode steps. No atomics; capturable in a CUDA graph.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/row_invariant_linear.h"

namespace jtok::cuda {

// out (M,OC) (+)= inp (M,C) weight (OC,C)^T (+ bias (OC); null: none); accumulate adds to out; inp
// normed first when norm.gain (RowNorm: each element x * rstd * gain rounded to bf16, the bits
// rmsnorm_forward stores, so the bits of that norm then this product). Out: __nv_bfloat16 or float.
// C a multiple of 8 and inp, weight, gain 16-byte aligned, else it fails saying so. Rows are dense
// (row strides C and OC). M 0 does nothing.
template <typename Out>
void row_invariant_linear_mma(Out* out, const __nv_bfloat16* inp, const __nv_bfloat16* weight, const Out* bias,
                              int64_t M, int64_t C, int64_t OC, bool accumulate, cudaStream_t stream,
                              const RowNorm<__nv_bfloat16>& norm = {});

// out (M,F) = silu(gate) * up of gate | up = inp (M,C) weight (2F,C)^T (inp normed first when
// norm.gain; weight's first F rows the gate's, the next F the up's): the sums above, gate and up each
// rounded to bf16, then swiglu_forward's value: the bits of row_invariant_linear_mma of the 2F
// columns followed by swiglu_forward. A block owns 4 gate columns and their 4 up columns.
void row_invariant_swiglu_mma(__nv_bfloat16* out, const __nv_bfloat16* inp, const __nv_bfloat16* weight, int64_t M,
                              int64_t C, int64_t F, cudaStream_t stream, const RowNorm<__nv_bfloat16>& norm = {});

// Whether the tensor-core kernels can load these operands (C a multiple of 8, the pointers 16-byte
// aligned; gain may be null).
bool mma_loads(const void* inp, const void* weight, const void* gain, int64_t C);

// A decode step's product as its decoder chose (the Matmul's setting, cuda/matmul.h): with
// tensor_cores, row_invariant_linear_mma where In is bf16 and mma_loads, else row_invariant_linear.
// Which one runs depends on the setting, the types, C and the step's (fixed) buffers, never on M:
// either way a row's bits are its own.
template <typename In, typename Out>
void row_invariant_product(bool tensor_cores, Out* out, const In* inp, const In* weight, const Out* bias, int64_t M,
                           int64_t C, int64_t OC, bool accumulate, cudaStream_t stream, const RowNorm<In>& norm = {});
// The same for the SwiGLU product (row_invariant_swiglu_mma or row_invariant_swiglu).
template <typename T>
void row_invariant_swiglu_product(bool tensor_cores, T* out, const T* inp, const T* weight, int64_t M, int64_t C,
                                  int64_t F, cudaStream_t stream, const RowNorm<T>& norm = {});

}  // namespace jtok::cuda
