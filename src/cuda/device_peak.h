// `jtok bench-peak --device cuda`: what device 0 reaches, the denominators of the GPU's figures
// (docs/cuda.md): bf16 products by cuBLASLt through the trainer's own Matmul (bf16 in and out, fp32
// sums: its plans, its algorithm choice), each checked on sampled entries against the host's sum so
// that a wrong product is never reported as a fast one; a device-to-device copy (device memory's
// bandwidth, bytes read + written); pinned host <-> device copies (the token-table rows' path,
// docs/cuda-inference.md). Timed by events on one stream: the best of reps calls after a warm-up.
// A plain C++ header: the CPU-only build has it too (device_require.cpp), where it says why there
// is no device.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

namespace jtok::cuda {

struct PeakProduct {
  int64_t M = 0, N = 0, K = 0;  // x (M, K) times W (N, K) transposed -> (M, N): a linear layer's forward
  double ms = 0, tflops = 0;    // the best call's
  double max_rel_error = 0;     // of the sampled entries against the host's sum (bf16 rounding: <= 2^-8)
};

struct DevicePeaks {
  std::vector<PeakProduct> products;
  int64_t copy_bytes = 0;           // each copy's size
  double device_copy_gbs = 0;       // device -> device: (read + written) bytes a second / 1e9
  double h2d_gbs = 0, d2h_gbs = 0;  // pinned host memory -> device, and back
};

// The products (M, N, K) and copies of copy_bytes, each best of reps (>= 1) after one warm-up.
// Throws an Error naming the product when a sampled entry is off by more than 2^-7 relative.
DevicePeaks measure_device_peaks(const std::vector<std::array<int64_t, 3>>& products, int64_t copy_bytes, int reps);

// The operands' values: element i of x (M, K) and of W (N, K) is ((i mod 13) - 6) / 8, exact in bf16,
// so every fp32 sum of K < 2^18 products is exact and an entry's only error is its bf16 rounding.
// c (M, N) bf16 on the device: the largest relative error of 16 entries spread over it against the
// host's exact sums (relative to max(|sum|, 1)); exposed for its test.
double sampled_product_error(const void* c, int64_t M, int64_t N, int64_t K);

}  // namespace jtok::cuda
