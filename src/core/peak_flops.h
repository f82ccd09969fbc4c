// This machine's fp32 FMA peak: one core's register-only FMA loop (best of a few trials) times the
// OpenMP thread count.
// Used as the MFU denominator (the machines here expose AVX2 or AVX-512 depending on the host).
// And its memory bandwidth, STREAM's triad: the denominator of memory-bound decode.
#pragma once

namespace jtok {

// GFLOP/s over all threads; `seconds` is roughly how long the measurement runs.
double measure_peak_gflops(double seconds = 0.2);
const char* simd_isa();  // "avx512" or "avx2"

struct TriadRate {
  double gbs = 0;         // best of 5, counting 3 x 4 bytes per element as STREAM does
  bool checked = false;   // the arrays hold what the last pass computes
};
// STREAM's triad a = b + s * c over three 32M-float arrays (384 MiB, far beyond the caches) with
// the OpenMP threads.
TriadRate measure_triad();

}  // namespace jtok
