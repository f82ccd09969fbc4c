// Int8 matrices dequantised on the GPU (src/cuda/q8_dequant.h): one block a row, a thread 4 values (or
// one, off 4-byte alignment) at a stride of the block, each one rounded fp32 product then rounded to E.
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

// Block b (grid-stride): row r. A row whose first value's address and width are multiples of 4 is
// read 4 bytes a thread (the same values as one at a time).
template <typename E>
__global__ void __launch_bounds__(kThreads) dequantize_q8_rows_kernel(E* out, const int8_t* q, const float* scale,
                                                                      const Q8Run* runs, int64_t n_runs, int64_t rows) {
  pdl_wait();
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const Q8Run& run = run_of(runs, n_runs, r);
    const int64_t at = run.value_offset + (r - run.first_row) * run.cols;
    const float s = scale[r];
    if ((reinterpret_cast<uintptr_t>(q + at) | static_cast<uintptr_t>(run.cols)) % 4 == 0) {
      const uint32_t* words = reinterpret_cast<const uint32_t*>(q + at);
      for (int64_t c = threadIdx.x; c < run.cols / 4; c += kThreads) store4(out + at + 4 * c, words[c], s);
    } else {
      for (int64_t c = threadIdx.x; c < run.cols; c += kThreads)
        out[at + c] = from_f32<E>(__fmul_rn(static_cast<float>(q[at + c]), s));
    }
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

template void dequantize_q8_rows<float>(float*, const int8_t*, const float*, const Q8Run*, int64_t, int64_t,
                                        cudaStream_t);
template void dequantize_q8_rows<__nv_bfloat16>(__nv_bfloat16*, const int8_t*, const float*, const Q8Run*, int64_t,
                                                int64_t, cudaStream_t);

}  // namespace jtok::cuda
