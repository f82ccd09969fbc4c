// RMSNorm forward and backward (src/cuda/rmsnorm.h). Forward: one warp a row. Backward: a block a
// contiguous range of rows, one row at a time (block sum of w*dy*xh), each column's dw owned by one
// thread in shared memory; the per-block dw partials summed in block order by a second kernel.
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/rmsnorm.h"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBwdBlocks = 512;  // a fixed partition of the rows: the sum order never depends on the GPU

// inp, out (N,C), weight (C), rstd (N): warp w of block b normalises row b*8 + w.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight, int64_t N, int64_t C, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= N) return;
  const int lane = threadIdx.x & 31;
  const T* x = inp + row * C;
  const float r = warp_rms_scale(x, C, eps, lane);
  if (lane == 0) rstd[row] = r;
  T* y = out + row * C;
  for (int64_t c = lane; c < C; c += 32) y[c] = from_f32<T>(to_f32(x[c]) * r * to_f32(weight[c]));
}

// Rows [b*rows, (b+1)*rows) of block b; dw_part (blocks, C) gets the block's sum of dy*xh.
// Dynamic shared memory: C floats of dw.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_backward_kernel(T* dinp, float* dw_part, const T* dout, const T* inp, const T* weight, const float* rstd,
                            int64_t N, int64_t C, int64_t rows) {
  extern __shared__ float dw[];
  __shared__ float red[32];
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dw[c] = 0.0f;
  const int64_t lo = blockIdx.x * rows, hi = min(N, lo + rows);
  const float invC = 1.0f / static_cast<float>(C);
  for (int64_t n = lo; n < hi; ++n) {
    const T* x = inp + n * C;
    const T* dy = dout + n * C;
    const float r = rstd[n];
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += to_f32(weight[c]) * to_f32(dy[c]) * to_f32(x[c]) * r;
    const float mean = block_sum(dot, red) * invC;
    T* dx = dinp + n * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float xh = to_f32(x[c]) * r, g = to_f32(dy[c]);
      dw[c] += g * xh;  // column c is this thread's alone
      dx[c] = from_f32<T>(to_f32(dx[c]) + r * (to_f32(weight[c]) * g - xh * mean));
    }
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dw_part[blockIdx.x * C + c] = dw[c];
}

// dweight (C) += sum over blocks b = 0, 1, ... of dw_part (blocks, C), in that order.
__global__ void __launch_bounds__(kThreads)
    sum_partials_kernel(float* dweight, const float* dw_part, int64_t blocks, int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) s += dw_part[b * C + c];
  dweight[c] += s;
}

int64_t backward_blocks(int64_t N) { return N < kMaxBwdBlocks ? N : kMaxBwdBlocks; }

}  // namespace

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int64_t N, int64_t C, float eps,
                     cudaStream_t stream) {
  if (N == 0) return;
  rmsnorm_forward_kernel<T><<<ceil_div(N, kThreads / 32), kThreads, 0, stream>>>(out, rstd, inp, weight, N, C, eps);
  JTOK_CUDA_CHECK_LAUNCH();
}

int64_t rmsnorm_backward_scratch(int64_t N, int64_t C) { return backward_blocks(N) * C; }

template <typename T>
void rmsnorm_backward(T* dinp, float* dweight, float* scratch, const T* dout, const T* inp, const T* weight,
                      const float* rstd, int64_t N, int64_t C, cudaStream_t stream) {
  if (N == 0) return;
  const int64_t blocks = backward_blocks(N), rows = (N + blocks - 1) / blocks;
  const size_t shared = static_cast<size_t>(C) * sizeof(float);
  JTOK_CHECK(shared <= 48 * 1024, "rmsnorm_backward: C = ", C, " exceeds the 12288 columns of its shared dw");
  rmsnorm_backward_kernel<T><<<static_cast<int>(blocks), kThreads, shared, stream>>>(dinp, scratch, dout, inp, weight,
                                                                                    rstd, N, C, rows);
  JTOK_CUDA_CHECK_LAUNCH();
  if (!dweight) return;
  sum_partials_kernel<<<ceil_div(C, kThreads), kThreads, 0, stream>>>(dweight, scratch, blocks, C);
  JTOK_CUDA_CHECK_LAUNCH();
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int64_t, int64_t, float, cudaStream_t);
template void rmsnorm_forward<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*, const __nv_bfloat16*,
                                             int64_t, int64_t, float, cudaStream_t);
template void rmsnorm_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                      int64_t, int64_t, cudaStream_t);
template void rmsnorm_backward<__nv_bfloat16>(__nv_bfloat16*, float*, float*, const __nv_bfloat16*,
                                              const __nv_bfloat16*, const __nv_bfloat16*, const float*, int64_t,
                                              int64_t, cudaStream_t);

}  // namespace jtok::cuda
