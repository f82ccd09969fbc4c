// Token embedding forward (a thread 16 bytes of a row where the rows and pointers allow, else an
// element) and backward (one block a unique id: each thread a column, the id's positions in order;
// a hot id's in pieces first, cuda/hot_ids.cuh) (src/cuda/embedding.h).
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/embedding.h"
#include "cuda/hot_ids.cuh"
#include "cuda/pdl.cuh"
#include "cuda/vec.cuh"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    embedding_forward_kernel(T* out, const int32_t* ids, const T* weight, int64_t N, int64_t C) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * C) return;
  const int64_t n = i / C, c = i % C;
  out[i] = weight[static_cast<int64_t>(ids[n]) * C + c];
}

// The same 16 bytes a thread (cuda/vec.cuh), copied as they are: thread k, out[k V .. k V + V).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    embedding_forward_vec_kernel(T* out, const int32_t* ids, const T* weight, int64_t N, int64_t C) {
  pdl_wait();
  VecSlot t;
  if (!vec_slot<T>(t, N, C)) return;
  __stwb(reinterpret_cast<uint4*>(out + t.k * kVec<T>),
         *reinterpret_cast<const uint4*>(weight + static_cast<int64_t>(ids[t.row]) * C + t.col));
}

// Block q: piece q of the batch's hot ids (hot_ids.cuh) -> hot row q (C) = its dout rows from zero,
// in position order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    embedding_hot_kernel(float* hot, const T* __restrict__ dout, DeviceRowBatch rb, int64_t N, int64_t C) {
  pdl_wait();
  sum_hot_piece(hot, rb, N, C, [&](int64_t n, int64_t j) { return to_f32(dout[n * C + j]); });
}

// Block u < U: dst row (by_id: dweight + unique[u]*C, accumulating onto it, its flag in touched set
// where given; else rows + u*C from 0) plus the dout rows of order[offsets[u] .. offsets[u+1]), in
// that order; a hot id plus its pieces' sums (embedding_hot_kernel's), in chunk order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    embedding_backward_kernel(float* dst, bool by_id, uint8_t* touched, const T* __restrict__ dout,
                              const float* __restrict__ hot, DeviceRowBatch rb, int64_t C) {
  pdl_wait();
  __shared__ int32_t pos[kHotChunk];
  const int u = blockIdx.x;
  if (u >= *rb.num_unique) return;
  if (touched && threadIdx.x == 0) touched[rb.unique[u]] = 1;
  float* row = dst + (by_id ? static_cast<int64_t>(rb.unique[u]) : static_cast<int64_t>(u)) * C;
  const PositionRange r{rb.offsets[u], rb.offsets[u + 1]};
  if (is_hot(r.lo, r.hi)) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      row[c] = add_hot_pieces_in_order(by_id ? row[c] : 0.0f, hot + c, r.lo, r.hi, C);
    return;
  }
  stage_positions(pos, rb.order, r);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = by_id ? row[c] : 0.0f;
#pragma unroll 8
    for (int t = 0; t < r.size(); ++t) acc += to_f32(dout[static_cast<int64_t>(pos[t]) * C + c]);
    row[c] = acc;
  }
}

template <typename T>
void launch_backward(float* dst, bool by_id, uint8_t* touched, const T* dout, const DeviceRowBatch& rb, int64_t N,
                     int64_t C, float* hot, cudaStream_t stream) {
  if (N == 0) return;
  embedding_hot_kernel<T><<<static_cast<int>(2 * hot_chunks(N)), kThreads, 0, stream>>>(hot, dout, rb, N, C);
  JTOK_CUDA_CHECK_LAUNCH();
  embedding_backward_kernel<T>
      <<<static_cast<int>(entry_blocks(rb, N)), kThreads, 0, stream>>>(dst, by_id, touched, dout, hot, rb, C);
  JTOK_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* weight, int64_t N, int64_t C, cudaStream_t stream) {
  if (N * C == 0) return;
  if (vec_fits<T>({out, weight}, {C}))
    embedding_forward_vec_kernel<T>
        <<<ceil_div(N * C / kVec<T>, kThreads), kThreads, 0, stream>>>(out, ids, weight, N, C);
  else
    embedding_forward_kernel<T><<<ceil_div(N * C, kThreads), kThreads, 0, stream>>>(out, ids, weight, N, C);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename T>
void embedding_backward(float* dweight, const T* dout, const DeviceRowBatch& rb, int64_t N, int64_t C, float* hot,
                        cudaStream_t stream, uint8_t* touched) {
  if (dweight) launch_backward(dweight, true, touched, dout, rb, N, C, hot, stream);  // null: a frozen embedding
}

template <typename T>
void embedding_backward_rows(float* grad_rows, const T* dout, const DeviceRowBatch& rb, int64_t N, int64_t C,
                             float* hot, cudaStream_t stream) {
  launch_backward(grad_rows, false, nullptr, dout, rb, N, C, hot, stream);
}

template void embedding_forward<float>(float*, const int32_t*, const float*, int64_t, int64_t, cudaStream_t);
template void embedding_forward<__nv_bfloat16>(__nv_bfloat16*, const int32_t*, const __nv_bfloat16*, int64_t, int64_t,
                                               cudaStream_t);
template void embedding_backward<float>(float*, const float*, const DeviceRowBatch&, int64_t, int64_t, float*,
                                        cudaStream_t, uint8_t*);
template void embedding_backward<__nv_bfloat16>(float*, const __nv_bfloat16*, const DeviceRowBatch&, int64_t, int64_t,
                                                float*, cudaStream_t, uint8_t*);
template void embedding_backward_rows<float>(float*, const float*, const DeviceRowBatch&, int64_t, int64_t, float*,
                                             cudaStream_t);
template void embedding_backward_rows<__nv_bfloat16>(float*, const __nv_bfloat16*, const DeviceRowBatch&, int64_t,
                                                     int64_t, float*, cudaStream_t);

}  // namespace jtok::cuda
