// Int8 matrices dequantised on the GPU (the GPU decoder's int8-only weights, DecoderSettings::
// int8_only: a prefill's products read a layer's matrices dequantised into a scratch just before
// them). The form is `jtok export --weight-dtype int8`'s (model/lowp_weights.h): one fp32 scale a
// row, W[r][c] = q[r][c] * scale[r], the product rounded to E once (float: exact fp32; bf16: round
// to nearest even): the value the host's dequantisation (params_block_f32) gives, so the scratch
// holds the bits of the copy the decoder otherwise uploads.
//   q, out: the runs' values back to back (value_offset); scale (rows): one a row, rows in order.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace jtok::cuda {

// Rows first_row .. first_row + rows - 1, cols values each, the first at value_offset; a layer's
// matrices are runs of rows with one width (q | k | v, o, gate | up, down; an MoE layer's experts
// two runs each).
struct Q8Run {
  int64_t first_row = 0, rows = 0, cols = 0, value_offset = 0;
};

// out[value_offset + (r - first_row) cols + c] = E(q[the same] * scale[r]) for every row r of the runs
// (n_runs on the device, sorted by first_row and covering rows 0 .. rows - 1 with no gap). E float or
// __nv_bfloat16. One block a row (grid-stride), its run found by binary search.
template <typename E>
void dequantize_q8_rows(E* out, const int8_t* q, const float* scale, const Q8Run* runs, int64_t n_runs, int64_t rows,
                        cudaStream_t stream);

// out (N, C) in E, row n = row ids[n] of the int8 matrix q (rows of C values, one scale a row)
// dequantised as above: the embedding's rows an int8_only decoder gathers (the bits of the copy's
// rows). Ids are the caller's, checked against the matrix's rows as every step's are. One block a
// row (grid-stride).
template <typename E>
void gather_q8_rows(E* out, const int32_t* ids, const int8_t* q, const float* scale, int64_t N, int64_t C,
                    cudaStream_t stream);

}  // namespace jtok::cuda
