// A linear layer's forward whose every output element is computed the same way whatever the batch
// (issue 40): out (M,OC) (+)= inp (M,C) weight (OC,C)^T (+ bias (OC)), fp32 accumulation, where an
// element's bits depend only on its own input row, the weight row, the bias and C, never on M or on
// the row's place among the M. cuBLASLt picks its algorithm (tiles, split-K) by the row count, so a
// decode step's logits would change in their last bits with the number of sequences beside it; the
// GPU decoder's decode steps take this product instead (cuda/matmul.h's RowInvariantProducts).
//
// How (row_invariant_linear.cu): a block of 4 warps owns 4 output columns; the input's C elements
// split into chunks of 32 lanes x 16 bytes (128 fp32 or 256 bf16), chunk k summed by warp k mod 4,
// each lane fma-ing its 16 bytes' elements in order into one fp32 accumulator per (column, row), its
// chunks in increasing order; then each warp's fixed shuffle tree, the 4 warps' sums in warp order,
// + bias, + out (accumulate). The rows go through in groups of up to 16 (the weight chunk loaded once
// a group), each row by the same sequence of operations. Unaligned pointers or a C that breaks the
// 16-byte rows read element by element: the same elements in the same order, so the same bits.
// At small M (a decode step) this is weight streaming: each weight read once a group of rows.
// No atomics; capturable in a CUDA graph (a plain launch).
//
// Instantiated for (In, Out) = (float, float), (__nv_bfloat16, __nv_bfloat16), (__nv_bfloat16, float);
// the weights in In, or int8 with a scale a row (row_invariant_linear_q8).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace jtok::cuda {

// An RMSNorm the product applies to its input rows first (gain null: none): row x becomes
// x * rstd * gain rounded to In, rstd = 1 / sqrt(mean(x^2) + eps) by warp_rms_scale (cuda/common.cuh),
// the bits rmsnorm_forward would store; so a product with a norm gives the bits of rmsnorm_forward
// followed by the plain product, in one kernel (the GPU decoder's decode steps: the input norm before
// q | k | v, the post-attention norm before gate | up, the final norm before the LM head).
template <typename In>
struct RowNorm {
  const In* gain = nullptr;  // (C)
  float eps = 0.0f;
};

// out (M,OC) (+)= inp (M,C) weight (OC,C)^T (+ bias (OC); null: none); accumulate adds to out; inp
// normed first when norm.gain.
// Rows are dense (row strides C and OC). M 0 does nothing.
template <typename In, typename Out>
void row_invariant_linear(Out* out, const In* inp, const In* weight, const Out* bias, int64_t M, int64_t C,
                          int64_t OC, bool accumulate, cudaStream_t stream, const RowNorm<In>& norm = {});

// row_invariant_linear of (out, weight, bias, OC) and, in the same launch, side_out (M, side_OC) fp32
// = inp side_weight (side_OC, C)^T of the same rows, normed alike, with no bias: each product's bits
// those of its own call (the side's row_invariant_linear<In, float>'s), the side's columns on blocks
// of their own after the main product's. The GPU decoder's decode steps: JTok-M's router beside
// q | k | v, one launch where two were (the router's 5 columns alone are 2 blocks).
template <typename In, typename Out>
void row_invariant_linear_and_side(Out* out, const In* inp, const In* weight, const Out* bias, int64_t M, int64_t C,
                                   int64_t OC, bool accumulate, float* side_out, const In* side_weight, int64_t side_OC,
                                   cudaStream_t stream, const RowNorm<In>& norm = {});

// out (M,F) = silu(gate) * up of gate | up = inp (M,C) weight (2F,C)^T (inp normed first when
// norm.gain), weight's first F rows the gate's and the next F the up's: row_invariant_linear's sums
// of the 2F columns, each rounded to T, then swiglu_forward's value rounded to T: the bits of that
// product followed by swiglu_forward, in one kernel (the GPU decoder's dense MLP in a decode step).
// T float or __nv_bfloat16.
template <typename T>
void row_invariant_swiglu(T* out, const T* inp, const T* weight, int64_t M, int64_t C, int64_t F,
                          cudaStream_t stream, const RowNorm<T>& norm = {});

// An int8 matrix (OC, C) with one fp32 scale a row (`jtok export --weight-dtype int8`'s symmetric
// per-row form, model/lowp_weights.h): W[o][c] = q[o][c] * scale[o].
struct Q8Weight {
  const int8_t* q = nullptr;     // (OC, C)
  const float* scale = nullptr;  // (OC)
};

// row_invariant_linear / row_invariant_swiglu of an int8 weight, read as it is stored (a byte a
// weight: the weight streaming of a decode step reads half of bf16's bytes): each weight becomes
// q * scale, one rounded fp32 product, as it is loaded, then the same sums in the same order. So
// with fp32 inputs the bits are those of the fp32 product of the dequantised matrix
// (model/lowp_weights.h's params_block_f32), and with bf16 inputs the product is of bf16 inputs and
// fp32 weights (no bf16 rounding of the weights). In float (V 4) or __nv_bfloat16 (V 8): the row's 4
// or 8 bytes a lane. MoE's grouped experts: row_invariant_expert_*_q8 below.
template <typename In, typename Out>
void row_invariant_linear_q8(Out* out, const In* inp, const Q8Weight& weight, const Out* bias, int64_t M, int64_t C,
                             int64_t OC, bool accumulate, cudaStream_t stream, const RowNorm<In>& norm = {});
template <typename T>
void row_invariant_swiglu_q8(T* out, const T* inp, const Q8Weight& weight, int64_t M, int64_t C, int64_t F,
                             cudaStream_t stream, const RowNorm<T>& norm = {});

// MoE's rows grouped by expert on the device (cuda/moe.h's moe_group): expert e = experts[i], for
// i < *num_experts, owns rows offsets[e] .. offsets[e+1] - 1; its weight lies at weight + e stride
// (int8: its scales at scale + e scale_stride).
struct ExpertRows {
  const int32_t* offsets = nullptr;      // (E+1); null: not grouped
  const int32_t* experts = nullptr;      // the experts with rows (max_experts bound)
  const int32_t* num_experts = nullptr;  // (1)
  int64_t max_experts = 0;  // at least *num_experts (min(E, rows)): the launch's blocks in y
  int64_t max_rows = 0;     // sizes a pass's row group (an expert's most rows: one pass each), never a bit
  int64_t stride = 0;       // elements between two experts' weights
  int64_t scale_stride = 0;  // int8 weights (the _q8 products): scales between two experts' weights
};

// MoE's expert products grouped on the device (a decode step's: no host sync, so a CUDA graph holds
// it): every expert's rows of inp (width C) times its weight (OC,C) into the same rows of out (width
// OC); each row's bits those of row_invariant_linear of its expert's weight alone (no bias, no
// accumulate). One launch of (OC/4, max_experts) blocks; blocks past *num_experts exit at once.
template <typename In, typename Out>
void row_invariant_expert_linear(Out* out, const In* inp, const In* weight, const ExpertRows& groups, int64_t C,
                                 int64_t OC, cudaStream_t stream);
// The same for SwiGLU of each expert's gate | up weight (2F,C) (row_invariant_swiglu's bits): out
// (rows, F).
template <typename T>
void row_invariant_expert_swiglu(T* out, const T* inp, const T* weight, const ExpertRows& groups, int64_t C, int64_t F,
                                 cudaStream_t stream);

// The two above with int8 experts read as stored (an int8 export's MoE layers in a decode step):
// expert e's weight is q + e groups.stride with its rows' scales at scale + e groups.scale_stride,
// each weight q * scale as it is loaded (row_invariant_linear_q8's values), so with fp32 inputs a
// row's bits are those of row_invariant_expert_* on the dequantised experts.
template <typename T>
void row_invariant_expert_linear_q8(T* out, const T* inp, const Q8Weight& weight, const ExpertRows& groups, int64_t C,
                                    int64_t OC, cudaStream_t stream);
template <typename T>
void row_invariant_expert_swiglu_q8(T* out, const T* inp, const Q8Weight& weight, const ExpertRows& groups, int64_t C,
                                    int64_t F, cudaStream_t stream);

}  // namespace jtok::cuda
