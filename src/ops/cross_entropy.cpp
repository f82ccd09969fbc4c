#include "ops/cross_entropy.h"

#include <cmath>

#include "core/parallel.h"
#include "ops/fast_exp.h"

namespace jtok {

double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                     float grad_scale) {
  return parallel_sum(N, [&](int64_t n) -> double {
    const float* x = logits + n * Vp;
    const int32_t y = targets[n];
    const float target_logit = x[y];  // read before an in-place write overwrites it
    float mx = x[0];
#pragma omp simd reduction(max : mx)
    for (int64_t j = 1; j < V; ++j) mx = x[j] > mx ? x[j] : mx;
    float sum = 0.0f;
    if (dlogits) {
      // Keep exp(x - mx) in dlogits, then scale: one exp per element.
      float* d = dlogits + n * Vp;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < V; ++j) {
        float e = fast_expf(x[j] - mx);
        d[j] = e;
        sum += e;
      }
      const float s = grad_scale / sum;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) d[j] *= s;
      d[y] -= grad_scale;
      for (int64_t j = V; j < Vp; ++j) d[j] = 0.0f;
    } else {
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < V; ++j) sum += fast_expf(x[j] - mx);
    }
    return static_cast<double>(mx + std::log(sum) - target_logit);
  });
}

void cross_entropy_rows(float* out, const float* logits, const int32_t* targets, int64_t N, int64_t V, int64_t Vp) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * Vp;
    float mx = x[0];
#pragma omp simd reduction(max : mx)
    for (int64_t j = 1; j < V; ++j) mx = x[j] > mx ? x[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; ++j) sum += fast_expf(x[j] - mx);
    out[n] = mx + std::log(sum) - x[targets[n]];
  }
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
