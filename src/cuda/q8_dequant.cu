// Int8 matrices dequantised on the GPU (src/cuda/q8_dequant.h): one block a row, a thread 4 values (or
// one, off 4-byte alignment) at a stride of the block, each one rounded fp32 product then rounded to E:
// a layer's runs of rows in place, or the rows of a list of ids gathered.
#include <cuda_bf16.h>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/pdl.cuh"
#include "cuda/q8_dequant.h"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

// The run holding row r: the last whose first_row <= r (runs sorted, the first at row 0).
__device__ __forceinline__ const Q8Run& run_of(const Q8Run* runs, int64_t n, int64_t r) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (runs[mid].first_row <= r)
      lo = mid;
    else
      hi = mid - 1;
  }
  return runs[lo];
}

// 4 values from 4 int8 bytes (w's bytes low to high) and the row's scale, stored at out.
template <typename E>
__device__ __forceinline__ void store4(E* out, uint32_t w, float s) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int q = static_cast<int>(w << (24 - 8 * j)) >> 24;  // byte j sign-extended
    out[j] = from_f32<E>(__fmul_rn(static_cast<float>(q), s));
  }
}

// The block's row: out (cols) = q (cols) * s, each rounded to E. A row whose first value's address
// and width are multiples of 4 is read 4 bytes a thread (the same values as one at a time).
template <typename E>
__device__ __forceinline__ void dequantize_row(E* out, const int8_t* q, float s, int64_t cols) {
  if ((reinterpret_cast<uintptr_t>(q) | static_cast<uintptr_t>(cols)) % 4 == 0) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(q);
    for (int64_t c = threadIdx.x; c < cols / 4; c += kThreads) store4(out + 4 * c, words[c], s);
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) out[c] = from_f32<E>(__fmul_rn(static_cast<float>(q[c]), s));
  }
}

// Block b (grid-stride): row r of the runs, in place.
template <typename E>
__global__ void __launch_bounds__(kThreads) dequantize_q8_rows_kernel(E* out, const int8_t* q, const float* scale,
                                                                      const Q8Run* runs, int64_t n_runs, int64_t rows) {
  pdl_wait();
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const Q8Run& run = run_of(runs, n_runs, r);
    const int64_t at = run.value_offset + (r - run.first_row) * run.cols;
    dequantize_row(out + at, q + at, scale[r], run.cols);
  }
}

// Block b (grid-stride): out row n from q's row ids[n].
template <typename E>
__global__ void __launch_bounds__(kThreads)
    gather_q8_rows_kernel(E* out, const int32_t* ids, const int8_t* q, const float* scale, int64_t N, int64_t C) {
  pdl_wait();
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const int64_t id = ids[n];
    dequantize_row(out + n * C, q + id * C, scale[id], C);
  }
}

}  // namespace

template <typename E>
void dequantize_q8_rows(E* out, const int8_t* q, const float* scale, const Q8Run* runs, int64_t n_runs, int64_t rows,
                        cudaStream_t stream) {
  if (n_runs < 1 || rows < 0) fail("cuda dequantize_q8_rows: ", n_runs, " runs, ", rows, " rows");
  if (rows == 0) return;
  const unsigned blocks = static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
  dequantize_q8_rows_kernel<E><<<blocks, kThreads, 0, stream>>>(out, q, scale, runs, n_runs, rows);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename E>
void gather_q8_rows(E* out, const int32_t* ids, const int8_t* q, const float* scale, int64_t N, int64_t C,
                    cudaStream_t stream) {
  if (N < 0 || C < 1) fail("cuda gather_q8_rows: ", N, " rows of ", C);
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>(N < kMaxBlocks ? N : kMaxBlocks);
  gather_q8_rows_kernel<E><<<blocks, kThreads, 0, stream>>>(out, ids, q, scale, N, C);
  JTOK_CUDA_CHECK_LAUNCH();
}

template void dequantize_q8_rows<float>(float*, const int8_t*, const float*, const Q8Run*, int64_t, int64_t,
                                        cudaStream_t);
template void dequantize_q8_rows<__nv_bfloat16>(__nv_bfloat16*, const int8_t*, const float*, const Q8Run*, int64_t,
                                                int64_t, cudaStream_t);
template void gather_q8_rows<float>(float*, const int32_t*, const int8_t*, const float*, int64_t, int64_t,
                                    cudaStream_t);
template void gather_q8_rows<__nv_bfloat16>(__nv_bfloat16*, const int32_t*, const int8_t*, const float*, int64_t,
                                            int64_t, cudaStream_t);

}  // namespace jtok::cuda
