// RMSNorm forward and backward (src/cuda/rmsnorm.h), on packed rows or on heads inside wider rows
// (NormRows). Forward: one warp a row. Backward: a block a contiguous range of rows, kBwdRows rows
// at a time (block sums of w*dy*xh), each column's dw owned by one thread in shared memory; the
// per-block dw partials summed in block order by a second kernel.
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/pdl.cuh"
#include "cuda/rmsnorm.h"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBwdBlocks = 512;  // a fixed partition of the rows: the sum order never depends on the GPU
constexpr int kBwdRows = 4;             // rows a backward block sums at once

// Row r's first element (rmsnorm.h's NormRows).
__device__ __forceinline__ int64_t row_start(int64_t r, int64_t C, NormRows rows) {
  return r / rows.heads * rows.stride + r % rows.heads * C;
}

// inp, out (N,C) laid out as rows, weight (C), rstd (N): warp w of block b normalises row b*8 + w.
template <typename T>
__global__ void __launch_bounds__(kThreads) rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight,
                                                                   int64_t N, int64_t C, float eps, NormRows rows) {
  pdl_wait();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= N) return;
  const int lane = threadIdx.x & 31;
  const int64_t at = row_start(row, C, rows);
  const T* x = inp + at;
  const float r = warp_rms_scale(x, C, eps, lane);
  if (lane == 0) rstd[row] = r;
  T* y = out + at;
  for (int64_t c = lane; c < C; c += 32) y[c] = from_f32<T>(to_f32(x[c]) * r * to_f32(weight[c]));
}

// Rows [b*per_block, (b+1)*per_block) of block b, kBwdRows at a time (their loads in flight
// together, one pair of barriers for their sums: a row's bits are those of one row at a time);
// dw_part (blocks, C) gets the block's sum of dy*xh, added row after row. Accumulate: dinp += dx;
// else dinp = dx, which may then be dout itself (each element is read and written by one thread,
// after the rows' sums). Dynamic shared memory: C floats of dw.
template <typename T, bool Accumulate>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_backward_kernel(T* dinp, float* dw_part, const T* dout, const T* inp, const T* weight, const float* rstd,
                            int64_t N, int64_t C, int64_t per_block, NormRows rows) {
  pdl_wait();
  extern __shared__ float dw[];
  __shared__ float red[32 * kBwdRows];
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dw[c] = 0.0f;
  const int64_t lo = blockIdx.x * per_block, hi = min(N, lo + per_block);
  const float invC = 1.0f / static_cast<float>(C);
  for (int64_t n0 = lo; n0 < hi; n0 += kBwdRows) {
    int64_t at[kBwdRows];
    float r[kBwdRows], dot[kBwdRows];
#pragma unroll
    for (int k = 0; k < kBwdRows; ++k) {
      at[k] = row_start(min(n0 + k, hi - 1), C, rows);  // a row past hi: read, never written
      r[k] = rstd[min(n0 + k, hi - 1)];
      dot[k] = 0.0f;
    }
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float w = to_f32(weight[c]);
#pragma unroll
      for (int k = 0; k < kBwdRows; ++k) dot[k] += w * to_f32(dout[at[k] + c]) * to_f32(inp[at[k] + c]) * r[k];
    }
    block_sums(dot, red);
#pragma unroll
    for (int k = 0; k < kBwdRows; ++k) {
      if (n0 + k >= hi) break;
      const float mean = dot[k] * invC;
      const T* x = inp + at[k];
      const T* dy = dout + at[k];
      T* dx = dinp + at[k];
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float xh = to_f32(x[c]) * r[k], g = to_f32(dy[c]);
        dw[c] += g * xh;  // column c is this thread's alone, its rows in order
        const float v = r[k] * (to_f32(weight[c]) * g - xh * mean);
        dx[c] = from_f32<T>(Accumulate ? to_f32(dx[c]) + v : v);
      }
    }
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dw_part[blockIdx.x * C + c] = dw[c];
}

// dweight (C) += sum over blocks b = 0, 1, ... of dw_part (blocks, C), in that order.
__global__ void __launch_bounds__(kThreads)
    rmsnorm_dweight_sum_kernel(float* dweight, const float* dw_part, int64_t blocks, int64_t C) {
  pdl_wait();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  // Up to 512 partials a column on only C threads: 32 loads in flight a thread, summed in order (the
  // same adds as one at a time), so a column waits out 16 trips to memory, not 512.
  dweight[c] += strided_sum_in_order(dw_part + c, blocks, C);
}

int64_t backward_blocks(int64_t N) { return N < kMaxBwdBlocks ? N : kMaxBwdBlocks; }

NormRows packed_if_unset(NormRows rows, int64_t C) {
  if (rows.stride == 0) rows = {1, C};
  JTOK_CHECK(rows.heads >= 1 && rows.stride >= rows.heads * C, "rmsnorm: ", rows.heads, " rows of ", C,
             " do not fit a stride of ", rows.stride);
  return rows;
}

// The backward's launches: the per-block partials, then their sum into dweight unless null.
template <typename T, bool Accumulate>
void launch_backward(T* dinp, float* dweight, float* scratch, const T* dout, const T* inp, const T* weight,
                     const float* rstd, int64_t N, int64_t C, cudaStream_t stream, NormRows rows) {
  if (N == 0) return;
  const int64_t blocks = backward_blocks(N), per_block = (N + blocks - 1) / blocks;
  const size_t shared = static_cast<size_t>(C) * sizeof(float);
  JTOK_CHECK(shared <= 48 * 1024, "rmsnorm_backward: C = ", C, " exceeds the 12288 columns of its shared dw");
  rmsnorm_backward_kernel<T, Accumulate><<<static_cast<int>(blocks), kThreads, shared, stream>>>(
      dinp, scratch, dout, inp, weight, rstd, N, C, per_block, packed_if_unset(rows, C));
  JTOK_CUDA_CHECK_LAUNCH();
  if (!dweight) return;
  rmsnorm_dweight_sum_kernel<<<ceil_div(C, kThreads), kThreads, 0, stream>>>(dweight, scratch, blocks, C);
  JTOK_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int64_t N, int64_t C, float eps,
                     cudaStream_t stream, NormRows rows) {
  if (N == 0) return;
  rmsnorm_forward_kernel<T><<<ceil_div(N, kThreads / 32), kThreads, 0, stream>>>(out, rstd, inp, weight, N, C, eps,
                                                                                 packed_if_unset(rows, C));
  JTOK_CUDA_CHECK_LAUNCH();
}

int64_t rmsnorm_backward_scratch(int64_t N, int64_t C) { return backward_blocks(N) * C; }

template <typename T>
void rmsnorm_backward(T* dinp, float* dweight, float* scratch, const T* dout, const T* inp, const T* weight,
                      const float* rstd, int64_t N, int64_t C, cudaStream_t stream) {
  launch_backward<T, true>(dinp, dweight, scratch, dout, inp, weight, rstd, N, C, stream, {});
}

template <typename T>
void rmsnorm_backward_in_place(T* dx, float* dweight, float* scratch, const T* inp, const T* weight, const float* rstd,
                               int64_t N, int64_t C, cudaStream_t stream, NormRows rows) {
  launch_backward<T, false>(dx, dweight, scratch, dx, inp, weight, rstd, N, C, stream, rows);
}

using bf16 = __nv_bfloat16;
#define JTOK_RMSNORM_INSTANTIATE(T)                                                                                   \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, int64_t, int64_t, float, cudaStream_t, NormRows);  \
  template void rmsnorm_backward<T>(T*, float*, float*, const T*, const T*, const T*, const float*, int64_t, int64_t, \
                                    cudaStream_t);                                                                    \
  template void rmsnorm_backward_in_place<T>(T*, float*, float*, const T*, const T*, const float*, int64_t, int64_t,  \
                                             cudaStream_t, NormRows);
JTOK_RMSNORM_INSTANTIATE(float)
JTOK_RMSNORM_INSTANTIATE(bf16)
#undef JTOK_RMSNORM_INSTANTIATE

}  // namespace jtok::cuda
