#include "ops/adamw.h"

#include <cmath>

namespace jtok {

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWHyper& h) {
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step)));
  const float step_size = h.lr / bc1;
  const float inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  const float decay = 1.0f - h.lr * h.weight_decay;
  const float b1 = h.beta1, b2 = h.beta2, eps = h.eps, gs = h.grad_scale;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * gs;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

void adamw_update_ref(float* p, const float* g, float* m, float* v, int64_t n, const AdamWHyper& h) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step));
  for (int64_t i = 0; i < n; ++i) {
    double gi = static_cast<double>(g[i]) * h.grad_scale;
    double pi = static_cast<double>(p[i]) * (1.0 - static_cast<double>(h.lr) * h.weight_decay);
    double mi = h.beta1 * static_cast<double>(m[i]) + (1.0 - h.beta1) * gi;
    double vi = h.beta2 * static_cast<double>(v[i]) + (1.0 - h.beta2) * gi * gi;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    p[i] = static_cast<float>(pi - (h.lr / bc1) * mi / (std::sqrt(vi) / std::sqrt(bc2) + h.eps));
  }
}

}  // namespace jtok
