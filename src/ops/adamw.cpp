#include "ops/adamw.h"

#include <algorithm>
#include <cmath>

namespace jtok {

AdamWStepConsts adamw_consts(const AdamWHyper& h) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step));
  return {h.beta1, h.beta2, h.eps, h.lr / static_cast<float>(bc1), 1.0f / std::sqrt(static_cast<float>(bc2)),
          1.0f - h.lr * h.weight_decay, h.grad_scale};
}

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWHyper& h) {
  const AdamWStepConsts c = adamw_consts(h);
  constexpr int64_t kBlock = 4096;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < (n + kBlock - 1) / kBlock; ++b) {
    const int64_t lo = b * kBlock, len = std::min(kBlock, n - lo);
    adamw_elements(p + lo, g + lo, m + lo, v + lo, len, c);
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
