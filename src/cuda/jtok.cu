// JTok (src/cuda/jtok.h). Prepare: one block a unique id (gather, block sum of squares, scale).
// Forward: a thread a 16-byte vector where the rows and pointers allow (cuda/vec.cuh), else an
// element. Table gradient: one block a unique id, each thread its columns, the id's positions in
// order (a hot id's in pieces first, cuda/hot_ids.cuh), writing their dmlp = dh p as it reads their
// dh; the row's dot and norm by block sums; ds per id into scratch, summed in runs of ids (id order
// within a run) and the runs in order by two more kernels. An identity batch (no dedup: a block a
// position, rows repeating) adds its row gradient by fp32 atomics: not bitwise reproducible.
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/hot_ids.cuh"
#include "cuda/jtok.h"
#include "cuda/pdl.cuh"
#include "cuda/vec.cuh"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    jtok_prepare_kernel(T* nrows, float* inv_norm, const T* E, DeviceRowBatch rb, int64_t d, float eps, bool norm) {
  pdl_wait();
  __shared__ float red[32];
  const int u = blockIdx.x;
  if (u >= *rb.num_unique) return;
  const T* e = E + static_cast<int64_t>(rb.unique[u]) * d;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += to_f32(e[j]) * to_f32(e[j]);
  ss = block_sum(ss, red);
  const float inv = norm ? 1.0f / (sqrtf(ss) + eps) : 1.0f;
  if (threadIdx.x == 0) inv_norm[u] = inv;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) nrows[u * d + j] = from_f32<T>(to_f32(e[j]) * inv);
}

// The gate p = 1 + s_j Norm(E[x])_j of column j, from the id's normed row (nrows' row): one
// expression for the forward's gate and the backward's dmlp = dh p.
__device__ __forceinline__ float gate_value(float s, float e) { return 1.0f + s * e; }
template <typename T>
__device__ __forceinline__ float gate_factor(const T* s, const T* nrow, int64_t j) {
  return gate_value(to_f32(s[j]), to_f32(nrow[j]));
}

// out (N,d) = a + b * p (the forward: a = h_mid, b = mlp_out); out may be a (the decoder's).
template <typename T>
__global__ void __launch_bounds__(kThreads) jtok_gate_kernel(T* out, const T* a, const T* b, const T* s, const T* nrows,
                                                             const int32_t* inverse, int64_t N, int64_t d) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * d) return;
  const int64_t n = i / d, j = i % d;
  const float v = to_f32(b[i]) * gate_factor(s, nrows + static_cast<int64_t>(inverse[n]) * d, j);
  out[i] = from_f32<T>(to_f32(a[i]) + v);
}

// The same a 16-byte vector a thread (cuda/vec.cuh): thread k, out[k V .. k V + V), V = kVec<T>.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    jtok_gate_vec_kernel(T* out, const T* a, const T* b, const T* s, const T* nrows, const int32_t* inverse, int64_t N,
                         int64_t d) {
  pdl_wait();
  constexpr int V = kVec<T>;
  VecSlot t;
  if (!vec_slot<T>(t, N, d)) return;
  float av[V], bv[V], sv[V], ev[V];
  load_vec(av, a + t.k * V);
  load_vec(bv, b + t.k * V);
  load_vec(sv, s + t.col);
  load_vec(ev, nrows + static_cast<int64_t>(inverse[t.row]) * d + t.col);
#pragma unroll
  for (int v = 0; v < V; ++v) av[v] = av[v] + bv[v] * gate_value(sv[v], ev[v]);
  store_vec(out + t.k * V, av);
}

// Block q: piece q of the batch's hot ids (hot_ids.cuh) -> hot row q (d) = the sum over its positions
// of dh * mlp_out, from zero in position order; and those positions' dmlp = dh * p.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    jtok_hot_kernel(float* hot, T* dmlp, const T* __restrict__ dh, const T* __restrict__ mlp_out, const T* s,
                    const T* nrows, DeviceRowBatch rb, int64_t N, int64_t d) {
  pdl_wait();
  sum_hot_piece(hot, rb, N, d, [&](int64_t n, int64_t j) {
    const int64_t at = n * d + j;
    const float g = to_f32(dh[at]);
    dmlp[at] = from_f32<T>(g * gate_factor(s, nrows + static_cast<int64_t>(rb.inverse[n]) * d, j));
    return g * to_f32(mlp_out[at]);
  });
}

// Block u < U: the row gradient of id u, and its positions' dmlp = dh * p (a hot id's: its pieces').
// Dynamic shared memory: d floats of dL/dNorm(E). hot: jtok_hot_kernel's pieces.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    jtok_table_grad_kernel(float* gE, uint8_t* touched, float* ds_part, T* dmlp, const float* __restrict__ hot,
                           const T* __restrict__ dh, const T* __restrict__ mlp_out, const T* s, const T* E,
                           const T* nrows, const float* inv_norm, DeviceRowBatch rb, int64_t d, bool norm) {
  pdl_wait();
  extern __shared__ float dnorm[];
  __shared__ float red[32];
  __shared__ int32_t pos[kHotChunk];
  const int u = blockIdx.x;
  if (u >= *rb.num_unique) return;
  const int64_t id = rb.unique[u];
  const T* e = E + id * d;
  const int lo = rb.offsets[u], hi = rb.offsets[u + 1];
  // A row not flagged has no gradient yet this step (its values are stale): it starts from zero. Read
  // before block_sum's barriers, so before thread 0 flags the row.
  const bool accumulate = touched[id] != 0;
  const bool hot_id = is_hot(lo, hi);  // the same in the whole block
  if (!hot_id) stage_positions(pos, rb.order, PositionRange{lo, hi});
  float dot = 0.0f, ss = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float sdp = 0.0f;  // sum over the id's positions of dh * mlp_out = dL/dp
    if (hot_id) {
      sdp = add_hot_pieces_in_order(sdp, hot + j, lo, hi, d);
    } else {
      const float p = gate_factor(s, nrows + u * d, j);
#pragma unroll 8
      for (int t = 0; t < hi - lo; ++t) {
        const int64_t at = static_cast<int64_t>(pos[t]) * d + j;
        const float g = to_f32(dh[at]);
        sdp += g * to_f32(mlp_out[at]);
        dmlp[at] = from_f32<T>(g * p);
      }
    }
    ds_part[u * d + j] = sdp * to_f32(nrows[u * d + j]);
    sdp *= to_f32(s[j]);  // now dL/dNorm(E)
    dnorm[j] = sdp;
    const float ej = to_f32(e[j]);
    dot += ej * sdp;
    ss += ej * ej;
  }
  dot = block_sum(dot, red);
  ss = block_sum(ss, red);
  const float inv = inv_norm[u];
  // Through the norm: dE = dNorm / (r + eps) - E (E . dNorm) / (r (r + eps)^2),  r = ||E||.
  const float r = sqrtf(ss);
  const float c = r > 0.0f ? dot * inv * inv / r : 0.0f;
  float* out = gE + id * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float g = norm ? dnorm[j] * inv - to_f32(e[j]) * c : dnorm[j];
    if (rb.distinct)
      out[j] = (accumulate ? out[j] : 0.0f) + g;
    else atomicAdd(out + j, g);  // an identity batch: another block may add to this row (order not fixed)
  }
  if (threadIdx.x == 0) touched[id] = 1;  // idempotent: every writer stores the same 1
}

constexpr int64_t kDsRuns = 64;  // ds's per-id partials summed in at most this many runs of ids

// Run c of the U ids (R = min(kDsRuns, U) runs, run c = [c U / R, (c + 1) U / R)): its partials
// summed in id order into the run's first row. Column j of a run's rows is this thread's alone, and
// no other run reads that row. Many blocks: one thread a column over all U ids (a few blocks at
// d 768) left the GPU idle for ~U loads in a row.
__global__ void __launch_bounds__(kThreads) jtok_ds_runs_kernel(float* ds_part, const int32_t* num_unique, int64_t d) {
  pdl_wait();
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, c = blockIdx.y;
  const int64_t U = *num_unique, R = U < kDsRuns ? U : kDsRuns;
  if (j >= d || c >= R) return;
  const int64_t lo = c * U / R, hi = (c + 1) * U / R;
  float acc = 0.0f;
  for (int64_t u = lo; u < hi; ++u) acc += ds_part[u * d + j];
  ds_part[lo * d + j] = acc;
}

// ds (d) += the runs' sums, in run order: a fixed order for a given U (no atomics).
__global__ void __launch_bounds__(kThreads)
    jtok_ds_kernel(float* ds, const float* ds_part, const int32_t* num_unique, int64_t d) {
  pdl_wait();
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  const int64_t U = *num_unique, R = U < kDsRuns ? U : kDsRuns;
  float acc = 0.0f;
  for (int64_t c = 0; c < R; ++c) acc += ds_part[(c * U / R) * d + j];
  ds[j] += acc;
}

}  // namespace

template <typename T>
void jtok_prepare(T* nrows, float* inv_norm, const T* E, const DeviceRowBatch& rb, int64_t N, int64_t d, float eps,
                  bool norm, cudaStream_t stream) {
  if (N == 0) return;
  jtok_prepare_kernel<T>
      <<<static_cast<int>(entry_blocks(rb, N)), kThreads, 0, stream>>>(nrows, inv_norm, E, rb, d, eps, norm);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename T>
void jtok_forward(T* h_next, const T* h_mid, const T* mlp_out, const T* s, const T* nrows, const DeviceRowBatch& rb,
                  int64_t N, int64_t d, cudaStream_t stream) {
  if (N * d == 0) return;
  if (vec_fits<T>({h_next, h_mid, mlp_out, s, nrows}, {d}))
    jtok_gate_vec_kernel<T><<<ceil_div(N * d / kVec<T>, kThreads), kThreads, 0, stream>>>(h_next, h_mid, mlp_out, s,
                                                                                          nrows, rb.inverse, N, d);
  else
    jtok_gate_kernel<T>
        <<<ceil_div(N * d, kThreads), kThreads, 0, stream>>>(h_next, h_mid, mlp_out, s, nrows, rb.inverse, N, d);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename T>
void jtok_backward(T* dmlp, float* ds, float* gE, uint8_t* touched, float* scratch, const T* dh, const T* mlp_out,
                   const T* s, const T* E, const T* nrows, const float* inv_norm, const DeviceRowBatch& rb, int64_t N,
                   int64_t d, bool norm, cudaStream_t stream) {
  if (N * d == 0) return;
  const size_t shared = static_cast<size_t>(d) * sizeof(float);
  // 48 KB of shared memory a block without opting in, the kernel's static arrays beside the row.
  JTOK_CHECK(shared <= 47 * 1024, "jtok_backward: d = ", d, " exceeds the 12032 columns of its shared row");
  float* hot = scratch + N * d;  // after ds's per-id partials
  // dmlp = dh * p as the table's gradient reads dh: a hot id's positions by the pieces' blocks, every
  // other position by its id's block (each position once), not a pass over dh of its own.
  jtok_hot_kernel<T>
      <<<static_cast<int>(2 * hot_chunks(N)), kThreads, 0, stream>>>(hot, dmlp, dh, mlp_out, s, nrows, rb, N, d);
  JTOK_CUDA_CHECK_LAUNCH();
  jtok_table_grad_kernel<T><<<static_cast<int>(entry_blocks(rb, N)), kThreads, shared, stream>>>(
      gE, touched, scratch, dmlp, hot, dh, mlp_out, s, E, nrows, inv_norm, rb, d, norm);
  JTOK_CUDA_CHECK_LAUNCH();
  jtok_ds_runs_kernel<<<dim3(static_cast<unsigned>(ceil_div(d, kThreads)), static_cast<unsigned>(kDsRuns)), kThreads, 0,
                        stream>>>(scratch, rb.num_unique, d);
  JTOK_CUDA_CHECK_LAUNCH();
  jtok_ds_kernel<<<ceil_div(d, kThreads), kThreads, 0, stream>>>(ds, scratch, rb.num_unique, d);
  JTOK_CUDA_CHECK_LAUNCH();
}

template void jtok_prepare<float>(float*, float*, const float*, const DeviceRowBatch&, int64_t, int64_t, float, bool,
                                  cudaStream_t);
template void jtok_prepare<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*, const DeviceRowBatch&, int64_t,
                                          int64_t, float, bool, cudaStream_t);
template void jtok_forward<float>(float*, const float*, const float*, const float*, const float*,
                                  const DeviceRowBatch&, int64_t, int64_t, cudaStream_t);
template void jtok_forward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                          const __nv_bfloat16*, const __nv_bfloat16*, const DeviceRowBatch&, int64_t,
                                          int64_t, cudaStream_t);
template void jtok_backward<float>(float*, float*, float*, uint8_t*, float*, const float*, const float*, const float*,
                                   const float*, const float*, const float*, const DeviceRowBatch&, int64_t, int64_t,
                                   bool, cudaStream_t);
template void jtok_backward<__nv_bfloat16>(__nv_bfloat16*, float*, float*, uint8_t*, float*, const __nv_bfloat16*,
                                           const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                           const __nv_bfloat16*, const float*, const DeviceRowBatch&, int64_t, int64_t,
                                           bool, cudaStream_t);

}  // namespace jtok::cuda
