// oneDNN sgemm's rate on a transformer-shaped product (`jtok bench-peak`): the achievable fp32
// GFLOP/s beside the FMA peak (core/peak_flops.h), for MFU denominators.
#pragma once

namespace jtok {

// GFLOP/s of gemm (4096 x 768) @ (768 x 3072), best of 3 after one warm-up call, with the OpenMP threads.
double measure_sgemm_gflops();

}  // namespace jtok
