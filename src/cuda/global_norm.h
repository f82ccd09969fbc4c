// The global gradient norm and its clip coefficient on the GPU, deterministic in two passes, as
// src/train/optimizer.cpp's grad_global_norm: an fp32 sum of squares per 4096-element chunk, the
// chunks summed in double in a fixed order; coef = max_norm / (norm + 1e-6) in fp32 when below 1
// (torch.nn.utils.clip_grad_norm_). Several tensors: each writes its chunks' partials side by side
// into one array, one sum_partials over all. The token tables' gradients are summed over their
// touched rows only (cuda/table_rows.h's list): a partial a listed row, after the flat ones, their
// number on the device.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace jtok::cuda {

constexpr int64_t kNormChunk = 4096;
inline int64_t sumsq_chunks(int64_t n) { return (n + kNormChunk - 1) / kNormChunk; }

// g (n) of G (float or __nv_bfloat16) -> partials (sumsq_chunks(n)) fp32.
template <typename G>
void sumsq_partials(float* partials, const G* g, int64_t n, cudaStream_t stream);

// g (rows' bound, d) fp32, rows (n bound) with *count (device) entries -> partials (*count): the fp32
// sum of squares of row rows[i], one block-sum tree a row (the same bits for any launch size).
void sumsq_rows_partials(float* partials, const float* g, const int32_t* rows, const int32_t* count, int64_t n,
                         int64_t d, cudaStream_t stream);

// partials (count + *more) -> sumsq (1, double) = their sum in double, in a fixed order. more: a
// count on the device (the listed rows' partials after the count flat ones), null: none.
void sum_partials(double* sumsq, const float* partials, int64_t count, cudaStream_t stream,
                  const int32_t* more = nullptr);

// sumsq (1, double) -> norm (1, double) = sqrt(sumsq); coef (1, float) = the clip coefficient
// (1 when max_norm <= 0 or the norm is within it). All on the device: AdamW reads coef there.
void clip_coef(float* coef, double* norm, const double* sumsq, float max_norm, cudaStream_t stream);

}  // namespace jtok::cuda
