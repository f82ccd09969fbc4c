// This machine's fp32 FMA peak: one core's register-only FMA loop (best of a few trials) times the
// OpenMP thread count.
// Used as the MFU denominator (the machines here expose AVX2 or AVX-512 depending on the host).
#pragma once

namespace jtok {

// GFLOP/s over all threads; `seconds` is roughly how long the measurement runs.
double measure_peak_gflops(double seconds = 0.2);
const char* simd_isa();  // "avx512" or "avx2"

}  // namespace jtok
