// The loads and stores of cuda/vec.h's 16-byte vectors in a kernel: kVec<T> elements as fp32 values.
// Words, not a view of T (strict aliasing: common.cuh's bf16x8_to_f32).
#pragma once
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/vec.h"

namespace jtok::cuda {

// This thread's vector of a grid over `rows` rows of `cols` elements (cols a multiple of kVec<T>), a
// vector a thread in row order: k its index (its first element k kVec<T> of the packed rows), row and
// col its place. False past the last vector.
struct VecSlot {
  int64_t k, row, col;
};
template <typename T>
__device__ __forceinline__ bool vec_slot(VecSlot& v, int64_t rows, int64_t cols) {
  const int64_t per_row = cols / kVec<T>;
  v.k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v.k >= rows * per_row) return false;
  v.row = v.k / per_row;
  v.col = (v.k - v.row * per_row) * kVec<T>;
  return true;
}

// p[0 .. kVec<T>) as fp32 (p 16-byte aligned).
template <typename T>
__device__ __forceinline__ void load_vec(float (&v)[kVec<T>], const T* p) {
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  if constexpr (std::is_same_v<T, float>) {
    v[0] = __uint_as_float(q.x), v[1] = __uint_as_float(q.y), v[2] = __uint_as_float(q.z), v[3] = __uint_as_float(q.w);
  } else {
    bf16x8_to_f32(v, q);
  }
}

// p[0 .. N) as fp32, N a multiple of kVec<T>, in 16-byte loads (p 16-byte aligned).
template <typename T, int N>
__device__ __forceinline__ void load_vecs(float (&v)[N], const T* p) {
  static_assert(N % kVec<T> == 0, "whole vectors");
#pragma unroll
  for (int k = 0; k < N; k += kVec<T>) {
    float w[kVec<T>];
    load_vec(w, p + k);
#pragma unroll
    for (int e = 0; e < kVec<T>; ++e) v[k + e] = w[e];
  }
}

// p[0 .. kVec<T>) = v, each rounded as from_f32<T> rounds it (p 16-byte aligned).
template <typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[kVec<T>]) {
  uint32_t w[4];
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = __float_as_uint(v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = f32x2_to_bf16x2(v[2 * i], v[2 * i + 1]);
  }
  __stwb(reinterpret_cast<uint4*>(p), make_uint4(w[0], w[1], w[2], w[3]));
}

}  // namespace jtok::cuda
