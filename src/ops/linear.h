// Linear layer y = x W^T (no bias). Weights are stored (out, in), as in PyTorch.
// The fast path is oneDNN's sgemm; the reference is a plain triple loop.
#pragma once
#include <cstdint>

namespace jtok {

// Row-major C(M,N) = alpha * op(A) op(B) + beta * C, op = transpose when trans_* is true.
// A is (M,K) or (K,M) if trans_a; B is (K,N) or (N,K) if trans_b. lda/ldb/ldc are row strides.
// Runs at the process's matmul precision (below); gemm_f32 always in fp32.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// The same product with A and B rounded to bf16 (nearest even) and fp32 accumulation and output
// (oneDNN's matmul primitive, one per shape, cached): mixed-precision training's matrix products.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// The same product on operands already rounded to bf16, each compact in its stored layout: A16 is
// (M,K), or (K,M) when trans_a; B16 is (K,N), or (N,K) when trans_b. gemm_bf16 rounds its fp32
// operands (quantize_bf16_rows) and calls this: an operand rounded once and reused gives the bits
// of rounding it per product.
void gemm_bf16_rounded(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A16,
                       const uint16_t* B16, float beta, float* C, int64_t ldc);

// The precision of gemm() (and so of linear_forward / linear_backward) for the whole process, as
// torch.set_float32_matmul_precision: set once at start (jtok train --precision). bf16 needs
// AVX-512 BF16 (bf16_matmul_supported); elsewhere setting it is an error the caller reports.
enum class MatmulPrecision { fp32, bf16 };
void set_matmul_precision(MatmulPrecision p);
MatmulPrecision matmul_precision();
bool bf16_matmul_supported();  // the CPU has AVX-512 BF16 (oneDNN's bf16 kernels run natively)

// out (N,OC) = inp (N,C) @ weight (OC,C)^T
void linear_forward(float* out, const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC);
// dinp (N,C) += dout (N,OC) @ weight (OC,C);  dweight (OC,C) += dout^T @ inp. dinp may be null; dweight
// null (a frozen weight: Model::backbone_frozen) skips its GEMM.
void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                     int64_t N, int64_t C, int64_t OC);

// Several products of one input (q, k, v; gate, up): p[i].out (N, p[i].rows) (+)= inp (N, C) @
// p[i].w (p[i].rows, C)^T. At bf16 precision the input is rounded once for all of them and the
// weights come from bf16_weight (ops/bf16_weights.h: once per training step); the same bits as one
// gemm each.
struct LinearProduct {
  float* out;
  const float* w;
  int64_t rows;
  bool accumulate;
};
void linear_forward_many(const LinearProduct* p, int n, const float* inp, int64_t N, int64_t C);
// Their backward, in order: dinp (N,C) += p[i].dout (N, rows) @ p[i].w, and p[i].dweight (rows, C)
// += p[i].dout^T @ inp (null: skipped). At bf16 precision inp and each dout are rounded once for
// both of their products; the same bits as one linear_backward each.
struct LinearGrad {
  float* dweight;
  const float* dout;
  const float* w;
  int64_t rows;
};
void linear_backward_many(float* dinp, const LinearGrad* p, int n, const float* inp, int64_t N, int64_t C);

void linear_forward_ref(float* out, const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC);
void linear_backward_ref(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                         int64_t N, int64_t C, int64_t OC);

}  // namespace jtok
