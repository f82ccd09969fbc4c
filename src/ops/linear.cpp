#include "ops/linear.h"

#include <oneapi/dnnl/dnnl.h>

#include "core/error.h"

namespace jtok {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  JTOK_CHECK(st == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(st));
}

void linear_forward(float* out, const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC) {
  gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
}

void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                     int64_t N, int64_t C, int64_t OC) {
  if (dinp) gemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
  gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
}

void linear_forward_ref(float* out, const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double acc = 0;
      for (int64_t c = 0; c < C; ++c) acc += static_cast<double>(inp[n * C + c]) * weight[o * C + c];
      out[n * OC + o] = static_cast<float>(acc);
    }
}

void linear_backward_ref(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                         int64_t N, int64_t C, int64_t OC) {
  if (dinp)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t o = 0; o < OC; ++o) acc += static_cast<double>(dout[n * OC + o]) * weight[o * C + c];
        dinp[n * C + c] += static_cast<float>(acc);
      }
  for (int64_t o = 0; o < OC; ++o)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t n = 0; n < N; ++n) acc += static_cast<double>(dout[n * OC + o]) * inp[n * C + c];
      dweight[o * C + c] += static_cast<float>(acc);
    }
}

}  // namespace jtok
