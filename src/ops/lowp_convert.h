// Low-precision weights and their conversions: a weight matrix in f32, bf16 or int8 with one fp32
// scale per output row (symmetric: W[o,c] ~ scale[o] * q[o,c], q in [-127,127]), fp32 <-> bf16,
// fp32 -> int8 per row (weights) or per block of 32 values (the input of an int8 product), and
// back to fp32. The products that use them: ops/lowp_linear.h.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace jtok {

// A (rows, cols) row-major weight matrix in one of the dtypes; scale is (rows) for int8, else null.
struct WeightMatrix {
  Dtype dtype = Dtype::f32;
  const void* data = nullptr;
  const float* scale = nullptr;
  int64_t rows = 0, cols = 0;
};

// Conversions. bf16: round to nearest even (NaN stays NaN). int8: scale[o] = max|W[o,:]| / 127
// (0 for an all-zero row), q = round(W / scale) clamped to [-127, 127].
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t b);
void quantize_bf16(uint16_t* out, const float* in, int64_t n);
// The same for one row, on the calling thread (no OpenMP region: a row of a caller's parallel loop).
void quantize_bf16_row(uint16_t* out, const float* in, int64_t n);
// rows x cols of src (row stride ld) to compact bf16 (rows x cols), as f32_to_bf16 (vcvtne2ps2bf16 where
// the CPU has it: the same rounding).
void quantize_bf16_rows(uint16_t* dst, const float* src, int64_t rows, int64_t cols, int64_t ld);
void quantize_int8_rows(int8_t* q, float* scale, const float* W, int64_t rows, int64_t cols);
// Whether all n values of x are finite: the row checks before int8 and int4 quantisation.
bool all_finite(const float* x, int64_t n);
// One span (a row, or a GGUF Q8_0 block) of n values to int8 as above; returns its scale.
float quantize_int8_span(int8_t* q, const float* x, int64_t n);
// Rows [r0, r1) of w as fp32 into out ((r1-r0), cols).
void dequantize_rows(float* out, const WeightMatrix& w, int64_t r0, int64_t r1);

constexpr int64_t kActBlock = 32;  // int8 products: activation values per scale

// x (n values) to int8 per block of kActBlock (the last may be shorter): scale[b] = max|x in block| / 127,
// q = round-to-nearest-even(x / scale[b]), as quantize_int8_span, which is its reference.
void quantize_act_q8(int8_t* q, float* scale, const float* x, int64_t n);

}  // namespace jtok
