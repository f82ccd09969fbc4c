// What the GPU op benchmarks (bench/cuda_*_op.cpp) share: bf16 normal noise on the device and a
// timing by cudaEvents on the default stream.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "cuda/check.h"

namespace jtok::bench {

// n bf16 values of N(0, scale^2) on the device (cudaFree to release).
inline __nv_bfloat16* device_randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<__nv_bfloat16> h(n);
  for (auto& x : h) x = __float2bfloat16(d(rng));
  __nv_bfloat16* p = nullptr;
  JTOK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(__nv_bfloat16)));
  JTOK_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  return p;
}

// Mean milliseconds of f over reps calls after two warm-ups, by events around the timed calls. f
// takes the call's index (0, 1, ...; the warm-ups 0 and 1 too) or nothing.
template <typename F>
double event_time_ms(F&& f, int reps) {
  const auto call = [&](int i) {
    if constexpr (std::is_invocable_v<F&, int>) f(i);
    else f();
  };
  for (int i = 0; i < 2; ++i) call(i);
  cudaEvent_t a, b;
  JTOK_CUDA_CHECK(cudaEventCreate(&a));
  JTOK_CUDA_CHECK(cudaEventCreate(&b));
  JTOK_CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) call(i);
  JTOK_CUDA_CHECK(cudaEventRecord(b));
  JTOK_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  JTOK_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}

}  // namespace jtok::bench
