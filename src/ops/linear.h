// Linear layer y = x W^T (no bias). Weights are stored (out, in), as in PyTorch.
// The fast path is oneDNN's sgemm; the reference is a plain triple loop.
#pragma once
#include <cstdint>

namespace jtok {

// Row-major C(M,N) = alpha * op(A) op(B) + beta * C, op = transpose when trans_* is true.
// A is (M,K) or (K,M) if trans_a; B is (K,N) or (N,K) if trans_b. lda/ldb/ldc are row strides.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// out (N,OC) = inp (N,C) @ weight (OC,C)^T
void linear_forward(float* out, const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC);
// dinp (N,C) += dout (N,OC) @ weight (OC,C);  dweight (OC,C) += dout^T @ inp. dinp may be null.
void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                     int64_t N, int64_t C, int64_t OC);

void linear_forward_ref(float* out, const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC);
void linear_backward_ref(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                         int64_t N, int64_t C, int64_t OC);

}  // namespace jtok
