// Reductions for training telemetry on the GPU (train/telemetry.h's figures from device activations).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace jtok::cuda {

// Doubles of scratch sum_and_squares needs.
int64_t sum_and_squares_scratch();
// x (n) of T (float or __nv_bfloat16) -> out (2) = {sum x, sum x^2} in double: per-block partials
// over fixed strides, summed in block order (the same bits every run).
template <typename T>
void sum_and_squares(double* out, const T* x, int64_t n, double* scratch, cudaStream_t stream);

}  // namespace jtok::cuda
