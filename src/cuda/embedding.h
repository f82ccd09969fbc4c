// Token embedding on the GPU, src/ops/embedding.h's contract: out[n] = weight[ids[n]], and its
// backward as a row-sparse gradient walked over the deduplicated ids (dedup.h): one block an id,
// its positions added in increasing order, as the CPU's embedding_backward adds them (fp32: the CPU
// op's bits); an id with more than kHotChunk positions in pieces on blocks of their own first, the
// pieces' sums added in order (cuda/hot_ids.cuh: within rounding of the CPU's). No atomics.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/dedup.h"

namespace jtok::cuda {

// ids (N), weight (V,C) -> out (N,C).
template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* weight, int64_t N, int64_t C, cudaStream_t stream);

// Floats of scratch the backward needs (its hot ids' pieces).
inline int64_t embedding_backward_scratch(int64_t N, int64_t C) { return hot_scratch_floats(N, C); }

// dout (N,C), rb = dedup_ids(ids) -> dweight (V,C) fp32: row unique[u] += the dout rows of its
// positions, in position order (the dense table gradient of the backbone's embed_tokens). dweight null
// (a frozen embedding): nothing. hot: embedding_backward_scratch(N, C) floats. touched (V, or null):
// each row added into flagged 1 (a row-sparse gradient's list, cuda/model.h's embed_flags).
template <typename T>
void embedding_backward(float* dweight, const T* dout, const DeviceRowBatch& rb, int64_t N, int64_t C, float* hot,
                        cudaStream_t stream, uint8_t* touched = nullptr);

// The same as rows: grad_rows (N bound, C) fp32, row u (< U) = the sum of unique[u]'s dout rows from
// zero (a row-sparse gradient keyed by rb.unique; rows past U untouched).
template <typename T>
void embedding_backward_rows(float* grad_rows, const T* dout, const DeviceRowBatch& rb, int64_t N, int64_t C,
                             float* hot, cudaStream_t stream);

}  // namespace jtok::cuda
