// 16-byte vectors for the elementwise kernels (cuda/vec.cuh has their loads and stores): kVec<T>
// elements of T (8 bf16 or 4 fp32) a thread moves with one instruction. A thread an element moves 2
// bytes a load in bf16 and does its index arithmetic (a 64-bit division) for each; a thread a vector
// moves 16 bytes and divides once. Each element's arithmetic is the same, so the bits are too. A
// launcher takes the vectors where vec_fits says so, else one element a thread. Host code.
#pragma once
#include <cstdint>
#include <initializer_list>

namespace jtok::cuda {

template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

// Whether a kernel over these pointers and row lengths may move kVec<T> elements at a time: every
// pointer 16-byte aligned, every length a multiple of kVec<T>.
template <typename T>
inline bool vec_fits(std::initializer_list<const void*> pointers, std::initializer_list<int64_t> lengths) {
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  for (int64_t n : lengths)
    if (n % kVec<T> != 0) return false;
  return true;
}

}  // namespace jtok::cuda
