// The AVX2 tiles of q8_gemm (ops/q8_gemm.h), for CPUs with AVX2 but not AVX-512 VNNI. Compiled for
// AVX2 + FMA by function attributes whatever the build's -march (and without AVX-512 on every host,
// CMakeLists.txt: an AVX-512 host then tests and times the very code an AVX2 host runs); call only
// where the CPU has AVX2 and FMA (q8_kernels_available).
#pragma once
#include <cstdint>

#include "ops/lowp_convert.h"

namespace jtok {

// out (N, w.rows) (+)= the int8 product of the quantised input (xq (N, Cp) int8 per block of 32,
// zero past w.cols; xs (N, nb) the blocks' scales) with w, as ops/q8_gemm.h states it.
void q8_gemm_avx2_tiles(float* out, const int8_t* xq, const float* xs, const WeightMatrix& w, int64_t N, int64_t Cp,
                        int64_t nb, bool acc);

}  // namespace jtok
