// Reductions for training telemetry on the GPU (train/telemetry.h's figures from device activations).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace jtok::cuda {

// Doubles of scratch sums_and_squares needs for L arrays.
int64_t sums_and_squares_scratch(int64_t L);
// xs[l] (n) of T (float or __nv_bfloat16) for l < L -> out (2L): {sum x, sum x^2} of each in double.
// Per-block partials over fixed strides (16 bytes a thread where every array is aligned and n a
// multiple of the vector, cuda/vec.h), summed in block order: the same bits every run. Two launches
// for up to 64 arrays (one layer's output each, a config's 12 to 48), whatever their number.
template <typename T>
void sums_and_squares(double* out, const std::vector<const T*>& xs, int64_t n, double* scratch, cudaStream_t stream);

}  // namespace jtok::cuda
