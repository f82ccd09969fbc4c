// AdamW on the GPU with fp32 master weights and moments, src/ops/adamw.h's update element for
// element (the constants from jtok::adamw_consts, computed once a step on the host):
//   g' = g * grad_scale;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2;
//   p = p * decay - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps)
// The clip coefficient is read on the device (global_norm.h's clip_coef), so a step needs no sync.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/step_consts.h"

namespace jtok::cuda {

// p, m, v (n) fp32, updated in place; g (n) of G (float or __nv_bfloat16); grad_scale: one float on
// the device multiplying g (null: 1); p_bf16 (n): the bf16 copy the forward reads, written from the
// new p unless null. g null: a zero gradient (only the decays), as the CPU's adamw_elements.
template <typename G>
void adamw_update(float* p, __nv_bfloat16* p_bf16, const G* g, float* m, float* v, int64_t n, const AdamWConsts& c,
                  const float* grad_scale, cudaStream_t stream);

}  // namespace jtok::cuda
