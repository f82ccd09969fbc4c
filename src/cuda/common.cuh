// Device-side helpers shared by the kernels (included by .cu files only): fp32 <-> storage type,
// and deterministic warp / block sums (a fixed shuffle tree: the same bits on every run).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace jtok::cuda {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// The 8 bf16 of 16 loaded bytes as fp32 (exact: a bf16's bits above 16 zero bits; little endian,
// element 2i the low half of word i). Shifts, not a bf16 view of the words (that breaks strict
// aliasing, and g++ -O2 in the emulation miscompiles it).
__device__ __forceinline__ void bf16x8_to_f32(float (&out)[8], uint4 raw) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// Two fp32 as two bf16 (from_f32's rounding) in one word, lo in the lower half (little endian: the
// pair's order in memory), the inverse of bf16x8_to_f32 for a pair.
__device__ __forceinline__ uint32_t f32x2_to_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// sum_{b < count} p[b * stride] added in b's order from zero, kAhead loads issued before their adds
// (a column of per-block partials: the same adds as a plain loop, a trip to memory a kAhead values).
template <int kAhead = 32>
__device__ __forceinline__ float strided_sum_in_order(const float* p, int64_t count, int64_t stride) {
  float s = 0.0f;
  int64_t b = 0;
  for (; b + kAhead <= count; b += kAhead) {
    float v[kAhead];
#pragma unroll
    for (int k = 0; k < kAhead; ++k) v[k] = p[(b + k) * stride];
#pragma unroll
    for (int k = 0; k < kAhead; ++k) s += v[k];
  }
  for (; b < count; ++b) s += p[b * stride];
  return s;
}

// Sum over the 32 lanes by xor butterflies: every lane gets the same value, in a fixed order.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets the
// result. `shared` holds 32 values of V. Starts and ends with a barrier, so it may be called in a loop.
template <typename V>
__device__ __forceinline__ V block_sum(V v, V* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  V s = lane < warps ? shared[lane] : V(0);
  return warp_sum(s);
}

// The block sums of G values at once: each component the tree block_sum makes, with one pair of
// barriers for all G (a block that sums several rows' values together keeps each row's bits).
// `shared` holds 32 G values of V. Starts and ends with a barrier.
template <int G, typename V>
__device__ __forceinline__ void block_sums(V (&v)[G], V* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int k = 0; k < G; ++k) v[k] = warp_sum(v[k]);
  __syncthreads();
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < G; ++k) shared[k * 32 + warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < G; ++k) v[k] = warp_sum(lane < warps ? shared[k * 32 + lane] : V(0));
}

// RMSNorm's scale of a row x (C) read by one warp: lane l sums the squares of x[l], x[l + 32], ...,
// then the warp's shuffle tree. Every RMSNorm of a warp a row (rmsnorm_forward, the decoder's
// per-head norm in cuda/paged_qkv.cu) goes through this, so fused and unfused give the same bits.
template <typename T>
__device__ __forceinline__ float warp_rms_scale(const T* x, int64_t C, float eps, int lane) {
  float ss = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float v = to_f32(x[c]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  return 1.0f / sqrtf(ss / static_cast<float>(C) + eps);
}

// RoPE's rotation of the pair (x_i, x_{i+hd/2}) by the angle's (c, s) (src/ops/rope.h's
// rotate_half), the arithmetic of every RoPE kernel (cuda/rope.cu, cuda/paged_qkv.cu) written once.
__device__ __forceinline__ void rope_rotate(float x1, float x2, float c, float s, float& y1, float& y2) {
  y1 = x1 * c - x2 * s;
  y2 = x2 * c + x1 * s;
}

// SwiGLU's value silu(g) u = g / (1 + e^-g) u, written once for every kernel that forms it
// (cuda/swiglu.cu, cuda/row_invariant_linear.cu's fused product).
__device__ __forceinline__ float swiglu_value(float g, float u) { return g / (1.0f + expf(-g)) * u; }

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace jtok::cuda
