// __nv_bfloat16 on the CPU (tests/cuda/emu): CUDA's bit layout (the top 16 bits of an fp32, in a
// 2-byte object), float -> bf16 by round-to-nearest-even (NaN kept a quiet NaN), bf16 -> float exact.
// Arithmetic goes through fp32 and rounds once, as sm_80+'s bf16 instructions do.
#pragma once
#include <cstdint>
#include <cstring>

#include "emu_device.h"

namespace emu {
inline uint16_t f32_to_bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace emu

struct __attribute__((aligned(2))) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(const __nv_bfloat16&) = default;
  __nv_bfloat16& operator=(const __nv_bfloat16&) = default;
  __nv_bfloat16(float f) : __x(emu::f32_to_bf16_rne(f)) {}
  __nv_bfloat16(double d) : __x(emu::f32_to_bf16_rne(static_cast<float>(d))) {}
  __nv_bfloat16(int i) : __x(emu::f32_to_bf16_rne(static_cast<float>(i))) {}
  operator float() const { return emu::bf16_to_f32(__x); }
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
using nv_bfloat16 = __nv_bfloat16;
using nv_bfloat162 = __nv_bfloat162;
static_assert(sizeof(__nv_bfloat16) == 2 && sizeof(__nv_bfloat162) == 4);

inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { __nv_bfloat16 h; h.__x = b; return h; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __ushort_as_bfloat16(emu::f32_to_bf16_rne(f)); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return emu::bf16_to_f32(h.__x); }
inline float __low2float(__nv_bfloat162 h) { return __bfloat162float(h.x); }
inline float __high2float(__nv_bfloat162 h) { return __bfloat162float(h.y); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __floats2bfloat162_rn(f.x, f.y); }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return {__low2float(h), __high2float(h)}; }
inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16_rn(float(a) + float(b)); }
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16_rn(float(a) * float(b)); }
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
  return __float2bfloat16_rn(std::fma(float(a), float(b), float(c)));
}
