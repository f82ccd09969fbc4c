// The inline PTX src/cuda uses, as warp-collective functions (tests/cuda/emu): cu2cpp.py rewrites
//   asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];" : outs : ins)
// into ::emu::ptx::ldmatrix_sync_aligned_m8n8_x4_shared_b16(outs..., ins...), the operands in the
// order of their %n (cu2cpp.py checks that order is 0, 1, 2, ...); an instruction without a
// function here fails to compile. Each gathers its operands from the whole warp (warp_gather), so
// every lane must reach it, as on the device (a lane that does not is reported as a deadlock).
// Fragment layouts: PTX ISA, "Matrix fragments for mma.m16n8k16" and "ldmatrix" (also written out
// in src/cuda/mma_bf16.cuh).
// Shared addresses are offsets into the launch's dynamic shared memory (the only shared memory the
// tensor-core kernels use): __cvta_generic_to_shared refuses any other pointer.
#pragma once
#include <cstdint>
#include <cstring>

namespace emu {
void* dynamic_shared_bytes();
size_t dynamic_shared_size();
[[noreturn]] void ptx_report(const char* what, const std::source_location& at);
}  // namespace emu

inline size_t __cvta_generic_to_shared(const void* p, emu::loc at = emu::loc::current()) {
  const auto* base = static_cast<const unsigned char*>(emu::dynamic_shared_bytes());
  const auto* q = static_cast<const unsigned char*>(p);
  if (q < base || q >= base + emu::dynamic_shared_size())
    emu::ptx_report("__cvta_generic_to_shared of a pointer outside the launch's dynamic shared memory", at);
  return static_cast<size_t>(q - base);
}

namespace emu::ptx {

// griddepcontrol.wait (src/cuda/pdl.cuh): the emulated GPU runs a grid only after the one before it
// has finished, so there is nothing to wait for.
inline void griddepcontrol_wait() {}

inline int lane() {
  return static_cast<int>((threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32);
}
inline float widen(uint32_t top) {  // a bf16's bits in the top half of an fp32: exact
  float f;
  std::memcpy(&f, &top, 4);
  return f;
}
inline float lo(uint32_t w) { return widen(w << 16); }
inline float hi(uint32_t w) { return widen(w & 0xffff0000u); }

// The 4 bytes at shared offset addr + bytes; a row address must be 16-byte aligned (ldmatrix's rule).
inline uint32_t shared_word(uint32_t row, int bytes, const loc& at) {
  if (row % 16 != 0) ptx_report("ldmatrix: a row address that is not 16-byte aligned", at);
  if (row + 16 > dynamic_shared_size()) ptx_report("ldmatrix: a row past the dynamic shared memory", at);
  uint32_t w;
  std::memcpy(&w, static_cast<const unsigned char*>(dynamic_shared_bytes()) + row + bytes, 4);
  return w;
}
inline uint16_t shared_half(uint32_t row, int bytes, const loc& at) {
  const uint32_t w = shared_word(row, bytes & ~3, at);
  return static_cast<uint16_t>((bytes & 2) ? w >> 16 : w & 0xffffu);
}

// Matrix i of an ldmatrix: lane 4g + t gets row g's elements 2t, 2t+1 (trans: column g's), rows at
// the addresses lanes 8i .. 8i+7 give (addrs: every lane's, gathered).
inline uint32_t ldmatrix_one(int i, const uint32_t* addrs, bool trans, const loc& at) {
  const int g = lane() / 4, t = lane() % 4;
  if (!trans) return shared_word(addrs[8 * i + g], 4 * t, at);
  const uint32_t r0 = addrs[8 * i + 2 * t], r1 = addrs[8 * i + 2 * t + 1];
  return static_cast<uint32_t>(shared_half(r0, 2 * g, at)) | static_cast<uint32_t>(shared_half(r1, 2 * g, at)) << 16;
}

inline void ldmatrix_sync_aligned_m8n8_x4_shared_b16(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                                     uint32_t addr, loc at = loc::current()) {
  uint32_t addrs[32];
  warp_gather(&addr, 1, addrs, at);
  const uint32_t a = ldmatrix_one(0, addrs, false, at), b = ldmatrix_one(1, addrs, false, at);
  const uint32_t c = ldmatrix_one(2, addrs, false, at), d = ldmatrix_one(3, addrs, false, at);
  r0 = a, r1 = b, r2 = c, r3 = d;
}
inline void ldmatrix_sync_aligned_m8n8_x2_shared_b16(uint32_t& r0, uint32_t& r1, uint32_t addr,
                                                     loc at = loc::current()) {
  uint32_t addrs[32];
  warp_gather(&addr, 1, addrs, at);
  const uint32_t a = ldmatrix_one(0, addrs, false, at), b = ldmatrix_one(1, addrs, false, at);
  r0 = a, r1 = b;
}
inline void ldmatrix_sync_aligned_m8n8_x2_trans_shared_b16(uint32_t& r0, uint32_t& r1, uint32_t addr,
                                                           loc at = loc::current()) {
  uint32_t addrs[32];
  warp_gather(&addr, 1, addrs, at);
  const uint32_t a = ldmatrix_one(0, addrs, true, at), b = ldmatrix_one(1, addrs, true, at);
  r0 = a, r1 = b;
}

// D = A (16x16, row) B (16x8, col) + C in fp32: each lane gathers A's rows g, g+8 and B's columns
// 2t, 2t+1 from the lanes holding them, sums the 16 exact bf16 products in k order, then adds C.
inline void mma_sync_aligned_m16n8k16_row_col_f32_bf16_bf16_f32(float& c0, float& c1, float& c2, float& c3,
                                                                 uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                                 uint32_t b0, uint32_t b1, loc at = loc::current()) {
  const int g = lane() / 4, t = lane() % 4;
  const uint32_t mine[6] = {a0, a1, a2, a3, b0, b1};
  uint32_t all[32][6];  // every lane's fragments
  warp_gather(mine, 6, &all[0][0], at);
  float A[2][16], B[2][16];  // A[row g / g+8][k], B[col 2t / 2t+1][k]
  for (int s = 0; s < 4; ++s) {  // source lane 4 x + s holds k = 2s, 2s+1 (regs 0/1) and 2s+8, 2s+9 (regs 2/3)
    const uint32_t* x = all[4 * g + s];
    A[0][2 * s] = lo(x[0]), A[0][2 * s + 1] = hi(x[0]), A[1][2 * s] = lo(x[1]), A[1][2 * s + 1] = hi(x[1]);
    A[0][2 * s + 8] = lo(x[2]), A[0][2 * s + 9] = hi(x[2]), A[1][2 * s + 8] = lo(x[3]), A[1][2 * s + 9] = hi(x[3]);
    for (int n = 0; n < 2; ++n) {
      const uint32_t* y = all[4 * (2 * t + n) + s];
      B[n][2 * s] = lo(y[4]), B[n][2 * s + 1] = hi(y[4]), B[n][2 * s + 8] = lo(y[5]), B[n][2 * s + 9] = hi(y[5]);
    }
  }
  float* c[4] = {&c0, &c1, &c2, &c3};
  for (int r = 0; r < 2; ++r)
    for (int n = 0; n < 2; ++n) {
      float s = 0.0f;
      for (int k = 0; k < 16; ++k) s += A[r][k] * B[n][k];
      *c[2 * r + n] += s;
    }
}

// cp.async.{cg,ca}.shared.global [dst], [src], cp_size, src_bytes (.cg: cp_size 16 only).
inline void cp_async_cg_shared_global(uint32_t dst, const void* src, int cp_size, int src_bytes,
                                      loc at = loc::current()) {
  if (cp_size != 16) ptx_report("cp.async.cg: a copy size other than 16", at);
  async_copy({dst, src, cp_size, src_bytes}, at);
}
inline void cp_async_ca_shared_global(uint32_t dst, const void* src, int cp_size, int src_bytes,
                                      loc at = loc::current()) {
  async_copy({dst, src, cp_size, src_bytes}, at);
}
inline void cp_async_commit_group() { async_commit(); }
inline void cp_async_wait_group(int pending) { async_wait(pending); }

}  // namespace emu::ptx
