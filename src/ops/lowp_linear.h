// Inference-only linear layers with low-precision weights: y = x W^T with W stored as bf16 or as
// int8 with one fp32 scale per output row (symmetric: W[o,c] ~ scale[o] * q[o,c], q in [-127,127]).
// Activations, accumulation and outputs stay fp32 (weight-only quantisation): only the bytes of
// weights read per token shrink, which is what bounds decoding.
//
// The fast path: for a few rows (decoding, N <= kLowpGemvRows) each thread converts a block of
// weight rows to fp32 once in L1 and takes every input row's dot product with it; for more rows
// (prefill) it converts a panel of weight rows to fp32 and hands it to sgemm, the conversion being
// O(OC*C) against the product's O(N*OC*C). The reference converts the whole matrix and runs the
// double-accumulating linear_forward_ref.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace jtok {

enum class WeightDType { f32, bf16, int8 };
const char* weight_dtype_name(WeightDType t);
WeightDType parse_weight_dtype(const std::string& s);  // "f32" | "bf16" | "int8", else a jtok::Error naming it
int64_t weight_dtype_bytes(WeightDType t);             // bytes per element: 4, 2, 1

// A (rows, cols) row-major weight matrix in one of the dtypes; scale is (rows) for int8, else null.
struct WeightMatrix {
  WeightDType dtype = WeightDType::f32;
  const void* data = nullptr;
  const float* scale = nullptr;
  int64_t rows = 0, cols = 0;
};

// Conversions. bf16: round to nearest even (NaN stays NaN). int8: scale[o] = max|W[o,:]| / 127
// (0 for an all-zero row), q = round(W / scale) clamped to [-127, 127].
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t b);
void quantize_bf16(uint16_t* out, const float* in, int64_t n);
// rows x cols of src (row stride ld) to compact bf16 (rows x cols), as f32_to_bf16 (vcvtne2ps2bf16 where
// the CPU has it: the same rounding).
void quantize_bf16_rows(uint16_t* dst, const float* src, int64_t rows, int64_t cols, int64_t ld);
void quantize_int8_rows(int8_t* q, float* scale, const float* W, int64_t rows, int64_t cols);
// One span (a row, or a GGUF Q8_0 block) of n values to int8 as above; returns its scale.
float quantize_int8_span(int8_t* q, const float* x, int64_t n);
// Rows [r0, r1) of w as fp32 into out ((r1-r0), cols).
void dequantize_rows(float* out, const WeightMatrix& w, int64_t r0, int64_t r1);

constexpr int64_t kLowpGemvRows = 16;

// out (N, OC) = inp (N, C) @ W^T for W (OC, C) = w (w.rows == OC, w.cols == C); with accumulate,
// out += instead of =.
void linear_forward_lowp(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate = false);
void linear_forward_lowp_ref(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate = false);

}  // namespace jtok
