// AdamW exactly as torch.optim.AdamW (decoupled weight decay), one fused pass over a tensor:
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr/(1-b1^k) * m / (sqrt(v)/sqrt(1-b2^k) + eps),   k = 1-based step.
#pragma once
#include <cmath>
#include <cstdint>

namespace jtok {

struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based
  float grad_scale = 1.0f;  // multiplies g first (gradient clipping folded in)
};

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWHyper& h);

// The per-step constants of the fused update, and the update of n consecutive elements
// (g == nullptr: a zero gradient, which leaves only the moments' decay and the weight decay).
struct AdamWStepConsts {
  float b1, b2, eps, step_size, inv_sqrt_bc2, decay, grad_scale;
};
AdamWStepConsts adamw_consts(const AdamWHyper& h);
inline void adamw_elements(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStepConsts& c) {
  if (!g) {  // a separate loop: a conditional load inside would keep the loop from vectorizing
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      // + 0.0f: the (1 - beta) * 0 of a zero gradient, kept so that -0 moments round as before
      const float mi = c.b1 * m[i] + 0.0f;
      const float vi = c.b2 * v[i] + 0.0f;
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] * c.decay - c.step_size * mi / (std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps);
    }
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * c.grad_scale;
    const float mi = c.b1 * m[i] + (1.0f - c.b1) * gi;
    const float vi = c.b2 * v[i] + (1.0f - c.b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * c.decay - c.step_size * mi / (std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps);
  }
}
void adamw_update_ref(float* p, const float* g, float* m, float* v, int64_t n, const AdamWHyper& h);

}  // namespace jtok
