// A plain tiled matrix product on the GPU: the reference the cuBLASLt path is checked against, and
// the LM head's products until that path lands (cross_entropy.h takes either). Same contract as
// src/ops/linear.h's gemm: row-major C (M,N) = alpha * op(A) @ op(B) + beta * C, op(A) (M,K) (A is
// (K,M) when trans_a), op(B) (K,N) (B is (N,K) when trans_b); lda/ldb/ldc row strides. fp32
// accumulation in k order (deterministic); A, B of T, C of TC (T, or float for accumulated weight
// gradients). beta 0 never reads C.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace jtok::cuda {

template <typename T, typename TC>
void gemm_ref(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
              const T* B, int64_t ldb, float beta, TC* C, int64_t ldc, cudaStream_t stream);

// The signature a matrix product offers the fused ops (gemm_ref, or the cuBLASLt one).
template <typename T, typename TC>
using GemmFn = void (*)(bool, bool, int64_t, int64_t, int64_t, float, const T*, int64_t, const T*, int64_t, float, TC*,
                        int64_t, cudaStream_t);

}  // namespace jtok::cuda
