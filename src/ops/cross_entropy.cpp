#include "ops/cross_entropy.h"

#include <cmath>

namespace jtok {

double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                     float grad_scale) {
  double total = 0.0;
#pragma omp parallel for reduction(+ : total) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * Vp;
    float mx = x[0];
    for (int64_t j = 1; j < V; ++j) mx = x[j] > mx ? x[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; ++j) sum += std::exp(x[j] - mx);
    const float lse = mx + std::log(sum);
    const int32_t y = targets[n];
    total += static_cast<double>(lse - x[y]);
    if (dlogits) {
      float* d = dlogits + n * Vp;
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) d[j] = grad_scale * std::exp(x[j] - mx) * inv;
      d[y] -= grad_scale;
      for (int64_t j = V; j < Vp; ++j) d[j] = 0.0f;
    }
  }
  return total;
}

double cross_entropy_ref(float* dlogits, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                         int64_t Vp, float grad_scale) {
  double total = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * Vp;
    double mx = x[0];
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, static_cast<double>(x[j]));
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(x[j] - mx);
    const int32_t y = targets[n];
    total += mx + std::log(sum) - x[y];
    if (dlogits) {
      for (int64_t j = 0; j < Vp; ++j)
        dlogits[n * Vp + j] = j < V ? static_cast<float>(grad_scale * (std::exp(x[j] - mx) / sum - (j == y))) : 0.0f;
    }
  }
  return total;
}

}  // namespace jtok
