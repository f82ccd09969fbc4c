// Rows of 4-bit integers, the int4 storage of token tables (model/token_table.h, jtok export
// --table-dtype int4): symmetric, one f32 scale a row, x ~ scale * q with scale = max|x| / 7 and
// q = round-to-nearest-even(x / scale) in [-7, 7] (0 and scale 0 for an all-zero row).
// Packed two values a byte: element 2i in the low half of byte i, element 2i + 1 in the high half,
// each a two's-complement nibble; a row of n values takes (n + 1) / 2 bytes and an odd row's last
// high half is 0, so every row starts on a byte and is read alone.
// Why [-7, 7] and not [-8, 7]: with a symmetric scale the row's largest magnitude, of either sign,
// lands exactly on +-7 and every value is within scale / 2 of its decoding; [-8, 7] with
// scale = max / 8 would clip a positive maximum to 7/8 of itself (an error of a whole step on the
// row's largest value), and an asymmetric scale (max / 7 for one sign, max / 8 for the other) costs
// a per-row sign flag for 1/15 more resolution.
#pragma once
#include <cstdint>

namespace jtok {

constexpr int kInt4Max = 7;

// One row: q ((n + 1) / 2 bytes) = x (n values) quantised as above; returns its scale.
float quantize_int4_row(uint8_t* q, const float* x, int64_t n);
// rows x cols of x (contiguous rows) to q (rows, (cols + 1) / 2) and scale (rows); fails naming the
// first row holding a non-finite value.
void quantize_int4_rows(uint8_t* q, float* scale, const float* x, int64_t rows, int64_t cols);
// The plain reference decoding of element j of a packed row: its nibble, sign-extended, times scale.
float int4_element(const uint8_t* q, float scale, int64_t j);
// out (n) = the packed row q decoded: a byte (two values) at a time; the same products as
// int4_element, bit for bit.
void dequantize_int4_row(float* out, const uint8_t* q, float scale, int64_t n);

}  // namespace jtok
