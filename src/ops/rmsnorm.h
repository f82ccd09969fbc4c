// RMSNorm: out = x / sqrt(mean(x^2) + eps) * weight, over the last dimension C.
#pragma once
#include <cstdint>

namespace jtok {

// out, inp (N,C); weight (C); rstd (N) saved for the backward.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps);
// dinp (N,C) += ..., dweight (C) += ...
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int64_t C);

void rmsnorm_forward_ref(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps);
void rmsnorm_backward_ref(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                          const float* rstd, int64_t N, int64_t C);

}  // namespace jtok
