// One element's AdamW update (device code; adamw.cu and table_adamw.cu), src/ops/adamw.h's
// adamw_elements in its order, with round-to-nearest intrinsics so that nvcc fuses nothing:
//   g' = g * scale;  m = b1 m + (1-b1) g';  v = b2 v + ((1-b2) g') g';
//   p = p * decay - (step_size * m) / (sqrt(v) * inv_sqrt_bc2 + eps)
// has_g false: a zero gradient (+ 0.0f in place of (1 - beta) * 0, so -0 moments round as the CPU's).
#pragma once
#include "cuda/adamw.h"

namespace jtok::cuda {

__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float g, bool has_g, float scale,
                                              const AdamWConsts& c) {
  if (has_g) {
    const float gi = __fmul_rn(g, scale);
    m = __fadd_rn(__fmul_rn(c.b1, m), __fmul_rn(1.0f - c.b1, gi));
    v = __fadd_rn(__fmul_rn(c.b2, v), __fmul_rn(__fmul_rn(1.0f - c.b2, gi), gi));
  } else {
    m = __fadd_rn(__fmul_rn(c.b1, m), 0.0f);
    v = __fadd_rn(__fmul_rn(c.b2, v), 0.0f);
  }
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), c.inv_sqrt_bc2), c.eps);
  p = __fsub_rn(__fmul_rn(p, c.decay), __fdiv_rn(__fmul_rn(c.step_size, m), denom));
}

}  // namespace jtok::cuda
