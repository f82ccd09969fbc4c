#include "ops/rmsnorm.h"

#include <cmath>
#include <vector>

#include <omp.h>

#include "core/parallel.h"

namespace jtok {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    float* y = out + n * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += x[c] * x[c];
    float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    rstd[n] = r;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = x[c] * r * weight[c];
  }
}

// With xh = x*r: dx = r * (w*dy - xh * mean(w*dy*xh)); dw = sum_n dy*xh.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int64_t C) {
  int nt = omp_get_max_threads();
  std::vector<float> dw_part(static_cast<size_t>(nt) * C, 0.0f);  // per-thread dweight, summed after
#pragma omp parallel if (N * C >= kParallelMin)
  {
    float* dw = dw_part.data() + static_cast<size_t>(omp_get_thread_num()) * C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      float* dx = dinp + n * C;
      float r = rstd[n];
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; ++c) dot += weight[c] * dy[c] * x[c] * r;
      float mean = dot / static_cast<float>(C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        float xh = x[c] * r;
        dw[c] += dy[c] * xh;
        dx[c] += r * (weight[c] * dy[c] - xh * mean);
      }
    }
  }
  for (int t = 0; dweight && t < nt; ++t)  // null: a frozen gain
    for (int64_t c = 0; c < C; ++c) dweight[c] += dw_part[static_cast<size_t>(t) * C + c];
}

void rmsnorm_forward_ref(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps) {
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(inp[n * C + c]) * inp[n * C + c];
    double r = 1.0 / std::sqrt(ss / C + eps);
    rstd[n] = static_cast<float>(r);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = static_cast<float>(inp[n * C + c] * r * weight[c]);
  }
}

void rmsnorm_backward_ref(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                          const float* rstd, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    double r = rstd[n];
    // y_c = x_c r w_c, r = (mean x^2 + eps)^-1/2, dr/dx_j = -r^3 x_j / C
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += static_cast<double>(dout[n * C + c]) * weight[c] * inp[n * C + c];
    for (int64_t j = 0; j < C; ++j) {
      double g = dout[n * C + j] * weight[j] * r - s * r * r * r * inp[n * C + j] / C;
      dinp[n * C + j] += static_cast<float>(g);
      dweight[j] += static_cast<float>(dout[n * C + j] * inp[n * C + j] * r);
    }
  }
}

}  // namespace jtok
