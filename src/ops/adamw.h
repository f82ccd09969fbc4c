// AdamW exactly as torch.optim.AdamW (decoupled weight decay), one fused pass over a tensor:
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr/(1-b1^k) * m / (sqrt(v)/sqrt(1-b2^k) + eps),   k = 1-based step.
#pragma once
#include <cstdint>

namespace jtok {

struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based
  float grad_scale = 1.0f;  // multiplies g first (gradient clipping folded in)
};

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWHyper& h);
void adamw_update_ref(float* p, const float* g, float* m, float* v, int64_t n, const AdamWHyper& h);

}  // namespace jtok
