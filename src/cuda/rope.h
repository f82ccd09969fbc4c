// Rotary position embedding on the GPU, src/ops/rope.h's contract (Hugging Face "rotate_half"):
// for i < hd/2, (x_i, x_{i+hd/2}) rotated by the angle of position t, from the CPU's own cos / sin
// tables (make_rope_table, uploaded once), so both devices rotate by the same fp32 values. S, the
// storage: float (checking) or __nv_bfloat16; fp32 arithmetic.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace jtok::cuda {

// x: B*T tokens of `stride` elements, head h of token (b,t) at x + (b*T + t)*stride + h*hd
// (stride H*hd for a packed (B,T,H,hd); wider for q or k inside a fused qkv row), rotated in place.
// cos, sin (T_table, hd/2) fp32; token t uses row pos0 + t.
template <typename S>
void rope_forward(S* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H, int64_t hd,
                  int64_t stride, int64_t pos0, cudaStream_t stream);

// dx in place (same layout): the inverse rotation, the transpose of the forward (positions 0..T-1).
template <typename S>
void rope_backward(S* dx, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H, int64_t hd,
                   int64_t stride, cudaStream_t stream);

}  // namespace jtok::cuda
