// The reference matrix product (src/cuda/gemm_ref.h): 16 x 16 output tiles, K in tiles of 16
// through shared memory. Slow (no tensor cores) and simple: for checking and small shapes.
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/gemm_ref.h"
#include "cuda/pdl.cuh"

namespace jtok::cuda {

namespace {

constexpr int kTile = 16;

template <typename T, typename TC>
__global__ void __launch_bounds__(kTile* kTile)
    gemm_ref_kernel(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
                    int64_t ldb, float beta, TC* C, int64_t ldc) {
  pdl_wait();
  __shared__ float as[kTile][kTile + 1], bs[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kTile + ty, col = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    const int64_t ka = k0 + tx, kb = k0 + ty;  // A tile (row, ka); B tile (kb, col)
    as[ty][tx] = row < M && ka < K ? to_f32(ta ? A[ka * lda + row] : A[row * lda + ka]) : 0.0f;
    bs[ty][tx] = kb < K && col < N ? to_f32(tb ? B[col * ldb + kb] : B[kb * ldb + col]) : 0.0f;
    __syncthreads();
    for (int k = 0; k < kTile; ++k) acc += as[ty][k] * bs[k][tx];
    __syncthreads();
  }
  if (row >= M || col >= N) return;
  TC* c = C + row * ldc + col;
  const float prev = beta != 0.0f ? to_f32(*c) * beta : 0.0f;
  *c = from_f32<TC>(alpha * acc + prev);
}

}  // namespace

template <typename T, typename TC>
void gemm_ref(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
              const T* B, int64_t ldb, float beta, TC* C, int64_t ldc, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  JTOK_CHECK(M <= int64_t{65535} * kTile, "gemm_ref: M = ", M, " rows exceed the grid's 65535 tiles of ", kTile);
  const dim3 grid(ceil_div(N, kTile), ceil_div(M, kTile)), block(kTile, kTile);
  gemm_ref_kernel<T, TC><<<grid, block, 0, stream>>>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  JTOK_CUDA_CHECK_LAUNCH();
}

template void gemm_ref<float, float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                                     int64_t, float, float*, int64_t, cudaStream_t);
template void gemm_ref<__nv_bfloat16, __nv_bfloat16>(bool, bool, int64_t, int64_t, int64_t, float,
                                                     const __nv_bfloat16*, int64_t, const __nv_bfloat16*, int64_t,
                                                     float, __nv_bfloat16*, int64_t, cudaStream_t);
template void gemm_ref<__nv_bfloat16, float>(bool, bool, int64_t, int64_t, int64_t, float, const __nv_bfloat16*,
                                             int64_t, const __nv_bfloat16*, int64_t, float, float*, int64_t,
                                             cudaStream_t);

}  // namespace jtok::cuda
