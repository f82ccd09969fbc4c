#include "ops/swiglu.h"

#include <cmath>

#include "ops/fast_exp.h"

#include "core/parallel.h"

namespace jtok {

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i];
    out[i] = g / (1.0f + fast_expf(-g)) * up[i];
  }
}

// d silu(g)/dg = s (1 + g (1 - s)), s = sigmoid(g)
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i];
    float s = 1.0f / (1.0f + fast_expf(-g));
    float silu = g * s;
    dup[i] = dout[i] * silu;
    dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
  }
}

void swiglu_forward_ref(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void swiglu_backward_ref(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double g = gate[i], s = 1.0 / (1.0 + std::exp(-g));
    dup[i] = static_cast<float>(dout[i] * g * s);
    dgate[i] = static_cast<float>(dout[i] * up[i] * (s + g * s * (1.0 - s)));
  }
}

}  // namespace jtok
