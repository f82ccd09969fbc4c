// The CUDA device language on the CPU (tests/cuda/emu): the thread coordinates, barriers, warp
// intrinsics, atomics and math a kernel calls, for g++. Every CUDA thread is a fiber on one OS
// thread (emu_sched.cpp); a block runs to its end before the next starts. A barrier or warp
// intrinsic parks the calling fiber until every thread it waits for has arrived, so a lane that
// misses a *_sync, or a block whose threads miss a __syncthreads, is reported (kernel, block,
// lanes, file:line) and aborts instead of hanging. Atomics are plain read-modify-writes: fibers
// switch only at barriers and warp intrinsics.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static  // a block's shared variable: blocks run one at a time
#define __align__(n) __attribute__((aligned(n)))
#define __CUDACC_EMU__ 1

struct uint3 { unsigned x = 0, y = 0, z = 0; };
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

// The running fiber's coordinates: set by the scheduler at every switch.
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
constexpr int warpSize = 32;

namespace emu {
enum class WarpOp { shfl, shfl_up, shfl_down, shfl_xor, ballot, sync, gather };
// Parks the calling lane at a warp intrinsic; back when every lane of `mask` arrived. Returns the
// 8 bytes this lane reads (a shuffle) or the ballot of `value != 0` over the mask.
uint64_t warp_exchange(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const std::source_location& at);
// Parks the calling lane until all 32 lanes of its warp arrived; then all[32 * n] holds every lane's
// n words (lane l's at all[l * n]). One park for what would be many shuffles (emu_ptx.h's ldmatrix
// and mma read 1 and 6 words of other lanes).
void warp_gather(const uint32_t* mine, int n, uint32_t* all, const std::source_location& at);
void block_barrier(const std::source_location& at);
template <typename T>
T warp_shuffle(WarpOp op, unsigned mask, T v, int arg, int width, const std::source_location& at) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  b = warp_exchange(op, mask, b, arg, width, at);
  T r;
  std::memcpy(&r, &b, sizeof(T));
  return r;
}
using loc = std::source_location;
}  // namespace emu

inline void __syncthreads(emu::loc at = emu::loc::current()) { emu::block_barrier(at); }
namespace emu {
// __syncthreads_count over the block's fibers (one OS thread, so the counter needs no lock): a
// barrier before the reset (every thread has read the last result), one before the counting, one
// after it.
inline int block_count(int pred, const std::source_location& at) {
  static thread_local int count = 0;
  block_barrier(at);
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) count = 0;
  block_barrier(at);
  count += pred != 0;
  block_barrier(at);
  return count;
}
}  // namespace emu
inline int __syncthreads_count(int pred, emu::loc at = emu::loc::current()) { return emu::block_count(pred, at); }
inline int __syncthreads_and(int pred, emu::loc at = emu::loc::current()) {
  return emu::block_count(!pred, at) == 0;
}
inline int __syncthreads_or(int pred, emu::loc at = emu::loc::current()) { return emu::block_count(pred, at) != 0; }
inline void __syncwarp(unsigned mask = 0xffffffffu, emu::loc at = emu::loc::current()) {
  emu::warp_exchange(emu::WarpOp::sync, mask, 0, 0, 32, at);
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32, emu::loc at = emu::loc::current()) {
  return emu::warp_shuffle(emu::WarpOp::shfl, mask, v, src, width, at);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32, emu::loc at = emu::loc::current()) {
  return emu::warp_shuffle(emu::WarpOp::shfl_up, mask, v, static_cast<int>(d), width, at);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32, emu::loc at = emu::loc::current()) {
  return emu::warp_shuffle(emu::WarpOp::shfl_down, mask, v, static_cast<int>(d), width, at);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, emu::loc at = emu::loc::current()) {
  return emu::warp_shuffle(emu::WarpOp::shfl_xor, mask, v, lane_mask, width, at);
}
inline unsigned __ballot_sync(unsigned mask, int p, emu::loc at = emu::loc::current()) {
  return static_cast<unsigned>(emu::warp_exchange(emu::WarpOp::ballot, mask, p != 0, 0, 32, at));
}
inline int __any_sync(unsigned mask, int p, emu::loc at = emu::loc::current()) { return __ballot_sync(mask, p, at) != 0; }
inline int __all_sync(unsigned mask, int p, emu::loc at = emu::loc::current()) {
  return __ballot_sync(mask, p, at) == __ballot_sync(mask, 1, at);
}
inline void __threadfence() {}
template <typename T>
T __ldcg(const T* p) { return *p; }  // a load past L1: the one memory here
inline void __threadfence_block() {}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
template <typename T>
T __ldg(const T* p) { return *p; }
// A store with the default (write-back) cache policy: its bytes, whatever the memory held before.
template <typename T>
void __stwb(T* p, T v) {
  std::memcpy(static_cast<void*>(p), &v, sizeof v);
}

// Bit casts and round-to-nearest arithmetic (-ffp-contract=off: g++ fuses nothing of its own).
template <typename To, typename From>
To emu_bits(From f) { static_assert(sizeof(To) == sizeof(From)); To t; std::memcpy(&t, &f, sizeof t); return t; }
inline unsigned __float_as_uint(float f) { return emu_bits<unsigned>(f); }
inline int __float_as_int(float f) { return emu_bits<int>(f); }
inline float __uint_as_float(unsigned u) { return emu_bits<float>(u); }
inline float __int_as_float(int i) { return emu_bits<float>(i); }
inline long long __double_as_longlong(double d) { return emu_bits<long long>(d); }
inline double __longlong_as_double(long long i) { return emu_bits<double>(i); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
// The GPU's fast approximations (__expf: ex2.approx, ~2 ulp) as the exact functions: results may
// differ from a GPU's in the last bits, never by more than its documented error.
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : x > 1.f ? 1.f : x; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }

// Device min / max: CUDA's overloads over mixed integer widths, here the common type.
template <typename A, typename B>
  requires std::is_arithmetic_v<A> && std::is_arithmetic_v<B>
constexpr std::common_type_t<A, B> min(A a, B b) { return b < a ? b : a; }
template <typename A, typename B>
  requires std::is_arithmetic_v<A> && std::is_arithmetic_v<B>
constexpr std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }

// Atomics: one OS thread, fibers switch only at barriers: a read-modify-write is atomic as written.
template <typename T>
T atomicAdd(T* p, T v) { T o = *p; *p = o + v; return o; }
template <typename T>
T atomicSub(T* p, T v) { T o = *p; *p = o - v; return o; }
template <typename T>
T atomicMax(T* p, T v) { T o = *p; if (o < v) *p = v; return o; }
template <typename T>
T atomicMin(T* p, T v) { T o = *p; if (v < o) *p = v; return o; }
template <typename T>
T atomicExch(T* p, T v) { T o = *p; *p = v; return o; }
template <typename T>
T atomicCAS(T* p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }
template <typename T>
T atomicOr(T* p, T v) { T o = *p; *p = o | v; return o; }
template <typename T>
T atomicAnd(T* p, T v) { T o = *p; *p = o & v; return o; }

// Vector types (CUDA's alignments).
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) int2 { int x, y; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(16))) double2 { double x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline int2 make_int2(int x, int y) { return {x, y}; }

namespace emu {
// The launch's dynamic shared memory (`extern __shared__ T name[]`, rewritten by cu2cpp.py into a
// call in the declaring function: `fn` is that function's __func__, so a namespace-scope
// declaration fails to compile). Filled with 0xff bytes (NaN floats) before each block.
void* dynamic_shared_bytes();
template <typename T>
T* dynamic_shared(const char* /*fn*/) { return static_cast<T*>(dynamic_shared_bytes()); }

// cp.async (emu_ptx.h): a copy of `bytes` (4, 8 or 16) global -> shared, the first src_bytes read,
// the rest zero. A thread's copies wait in its queue until a cp.async.wait_group lands their group
// (the latest a GPU may land them), so a read before the wait, or by another thread before a barrier
// after it, sees the bytes that were there.
struct AsyncCopy {
  size_t shared_offset = 0;
  const void* src = nullptr;
  int bytes = 16, src_bytes = 0;
};
void async_copy(const AsyncCopy& c, const std::source_location& at);
void async_commit();
void async_wait(int pending);  // every committed group but the newest `pending` lands
}  // namespace emu
#include "emu_ptx.h"
