// MoE routing, grouping, gather / combine and their backward (src/cuda/moe.h). Routing: one thread
// a position. Grouping: dedup_ids over the slots' experts (a stable sort: slot_of), offsets by a
// binary search a expert, row_of by scatter. Statistics: a block an expert; the aux loss sums them in order.
// Combine backward: one block a position (dw by block sums, the router's backward by thread 0).
// Gather and combine: a thread a 16-byte vector where the rows and pointers allow (cuda/vec.cuh).
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/dedup.h"
#include "cuda/moe.h"
#include "cuda/pdl.cuh"
#include "cuda/vec.cuh"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxK = static_cast<int>(kMoeMaxTopK);

__global__ void __launch_bounds__(kThreads)
    moe_route_kernel(float* probs, int32_t* topi, float* topw, const float* logits, MoeRouteDims m) {
  pdl_wait();
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= m.N) return;
  const int E = static_cast<int>(m.E), K = static_cast<int>(m.K);
  const float* g = logits + n * E;
  float* p = probs + n * E;
  float mx = g[0];
  for (int e = 1; e < E; ++e) mx = fmaxf(mx, g[e]);
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) sum += (p[e] = expf(g[e] - mx));
  for (int e = 0; e < E; ++e) p[e] /= sum;
  int32_t* ti = topi + n * K;
  for (int j = 0; j < K; ++j) {  // top_k_lower_index over the probabilities
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= ti[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    ti[j] = best;
  }
  float* tw = topw + n * K;
  float s = 0.0f;
  for (int j = 0; j < K; ++j) s += (tw[j] = p[ti[j]]);
  if (m.norm_topk)
    for (int j = 0; j < K; ++j) tw[j] /= s;
}

// offsets[e] = the first row of expert e: offsets_u at the first unique expert >= e (U <= E).
__global__ void __launch_bounds__(kThreads)
    moe_offsets_kernel(int32_t* offsets, const int32_t* unique, const int32_t* offsets_u, const int32_t* num_unique,
                       int64_t E) {
  pdl_wait();
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e > E) return;
  int lo = 0, hi = *num_unique;  // lower bound of e in unique[0 .. U)
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (unique[mid] < e) lo = mid + 1;
    else hi = mid;
  }
  offsets[e] = offsets_u[lo];
}

__global__ void __launch_bounds__(kThreads) moe_row_of_kernel(int32_t* row_of, const int32_t* slot_of, int64_t NK) {
  pdl_wait();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r < NK) row_of[slot_of[r]] = static_cast<int32_t>(r);
}

// Block e: frac[e] and P_e = sum_n probs[n,e] in double (prob_sums[e]), a block an expert (one block
// over every expert in turn read the (N,E) probabilities E times through one SM).
__global__ void __launch_bounds__(kThreads) moe_aux_terms_kernel(double* prob_sums, MoeDeviceRoute r, MoeRouteDims m) {
  pdl_wait();
  __shared__ double red[32];
  const int64_t e = blockIdx.x;
  double P = 0.0;
  for (int64_t n = threadIdx.x; n < m.N; n += blockDim.x) P += r.probs[n * m.E + e];
  P = block_sum(P, red);
  if (threadIdx.x != 0) return;
  r.frac[e] = static_cast<float>(r.offsets[e + 1] - r.offsets[e]) / static_cast<float>(m.N * m.K);
  prob_sums[e] = P;
}

// aux = coef E sum_e f_e (P_e / N), the experts in order.
__global__ void __launch_bounds__(1) moe_aux_kernel(const double* prob_sums, MoeDeviceRoute r, MoeRouteDims m) {
  pdl_wait();
  double aux = 0.0;
  for (int64_t e = 0; e < m.E; ++e) aux += r.frac[e] * (prob_sums[e] / static_cast<double>(m.N));
  *r.aux = m.aux_coef * static_cast<double>(m.E) * aux;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    moe_gather_kernel(T* xg, const T* x, const int32_t* slot_of, int64_t NK, int64_t K, int64_t d) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= NK * d) return;
  const int64_t r = i / d, c = i % d;
  xg[i] = x[(slot_of[r] / K) * d + c];
}

// out (N,d) += sum_j w[n,j] * rows[row_of[n*K+j]] (combine: w = topw; scatter backward: w null = 1).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    moe_combine_kernel(T* out, const T* rows, const int32_t* row_of, const float* w, int64_t N, int64_t K, int64_t d) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * d) return;
  const int64_t n = i / d, c = i % d;
  float o = to_f32(out[i]);
  for (int64_t j = 0; j < K; ++j) {
    const float v = to_f32(rows[static_cast<int64_t>(row_of[n * K + j]) * d + c]);
    o += w ? w[n * K + j] * v : v;
  }
  out[i] = from_f32<T>(o);
}

// The two above a 16-byte vector a thread (cuda/vec.cuh): thread k, xg[k V .. k V + V) copied as
// they are, or out[k V .. k V + V) with the same adds in the same order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    moe_gather_vec_kernel(T* xg, const T* x, const int32_t* slot_of, int64_t NK, int64_t K, int64_t d) {
  pdl_wait();
  VecSlot t;
  if (!vec_slot<T>(t, NK, d)) return;
  __stwb(reinterpret_cast<uint4*>(xg + t.k * kVec<T>),
         *reinterpret_cast<const uint4*>(x + (slot_of[t.row] / K) * d + t.col));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) moe_combine_vec_kernel(T* out, const T* rows, const int32_t* row_of,
                                                                   const float* w, int64_t N, int64_t K, int64_t d) {
  pdl_wait();
  constexpr int V = kVec<T>;
  VecSlot t;
  if (!vec_slot<T>(t, N, d)) return;
  const int64_t n = t.row, c = t.col;
  float o[V], v[V];
  load_vec(o, out + t.k * V);
  for (int64_t j = 0; j < K; ++j) {
    load_vec(v, rows + static_cast<int64_t>(row_of[n * K + j]) * d + c);
#pragma unroll
    for (int e = 0; e < V; ++e) o[e] += w ? w[n * K + j] * v[e] : v[e];
  }
  store_vec(out + t.k * V, o);
}

// out += the rows' combination (w null: their sum), by vectors where they fit.
template <typename T>
void launch_combine(T* out, const T* rows, const int32_t* row_of, const float* w, int64_t N, int64_t K, int64_t d,
                    cudaStream_t stream) {
  if (vec_fits<T>({out, rows}, {d}))
    moe_combine_vec_kernel<T>
        <<<ceil_div(N * d / kVec<T>, kThreads), kThreads, 0, stream>>>(out, rows, row_of, w, N, K, d);
  else
    moe_combine_kernel<T><<<ceil_div(N * d, kThreads), kThreads, 0, stream>>>(out, rows, row_of, w, N, K, d);
  JTOK_CUDA_CHECK_LAUNCH();
}

// Block n: deo rows = w_j dout[n], dw_j = dout[n] . eo[row]; then (thread 0) dL/dprobs through the
// weights and the aux loss, and the softmax backward, into dlogits[n] (used as the row's scratch).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    moe_combine_backward_kernel(T* deo, float* dlogits, const T* dout, const T* eo, MoeDeviceRoute r, MoeRouteDims m,
                                int64_t d, float aux_scale) {
  pdl_wait();
  __shared__ float red[32];
  __shared__ float dw[kMaxK];
  const int64_t n = blockIdx.x, E = m.E, K = m.K;
  for (int64_t j = 0; j < K; ++j) {
    const int64_t row = r.row_of[n * K + j];
    const float wj = r.topw[n * K + j];
    float acc = 0.0f;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      const float go = to_f32(dout[n * d + c]);
      deo[row * d + c] = from_f32<T>(wj * go);
      acc += go * to_f32(eo[row * d + c]);
    }
    acc = block_sum(acc, red);
    if (threadIdx.x == 0) dw[j] = acc;
  }
  if (threadIdx.x != 0) return;
  float* dp = dlogits + n * E;
  const float* p = r.probs + n * E;
  const int32_t* ti = r.topi + n * K;
  for (int64_t e = 0; e < E; ++e) dp[e] = aux_scale * r.frac[e];
  if (m.norm_topk) {  // w_j = p_j / sum_l p_l: dp_l = (dw_l - sum_j dw_j w_j) / sum
    float sum = 0.0f, dot = 0.0f;
    for (int64_t j = 0; j < K; ++j) sum += p[ti[j]], dot += dw[j] * r.topw[n * K + j];
    for (int64_t j = 0; j < K; ++j) dp[ti[j]] += (dw[j] - dot) / sum;
  } else {
    for (int64_t j = 0; j < K; ++j) dp[ti[j]] += dw[j];
  }
  float pd = 0.0f;  // softmax backward: dlogit_e = p_e (dp_e - sum_l p_l dp_l)
  for (int64_t e = 0; e < E; ++e) pd += p[e] * dp[e];
  for (int64_t e = 0; e < E; ++e) dp[e] = p[e] * (dp[e] - pd);
}

// The scratch of moe_group: dedup_ids' row batch (unique, inverse, offsets, count), the experts'
// probability sums (E doubles) and dedup_ids' scratch.
struct GroupScratch {
  DeviceRowBatch rb;
  double* prob_sums;
  void* dedup;
  size_t dedup_bytes;
};

size_t ints_bytes(int64_t n) { return (static_cast<size_t>(n) * sizeof(int32_t) + 255) / 256 * 256; }

GroupScratch carve(void* scratch, size_t bytes, int64_t NK, int64_t E) {
  char* p = static_cast<char*>(scratch);
  GroupScratch g;
  g.rb.unique = reinterpret_cast<int32_t*>(p);
  g.rb.inverse = reinterpret_cast<int32_t*>(p + ints_bytes(NK));
  g.rb.offsets = reinterpret_cast<int32_t*>(p + 2 * ints_bytes(NK));
  g.rb.num_unique = reinterpret_cast<int32_t*>(p + 2 * ints_bytes(NK) + ints_bytes(NK + 1));
  size_t used = 2 * ints_bytes(NK) + ints_bytes(NK + 1) + ints_bytes(1);
  g.prob_sums = reinterpret_cast<double*>(p + used);
  used += ints_bytes(2 * E);  // E doubles
  g.dedup = p + used;
  g.dedup_bytes = bytes - used;
  return g;
}

}  // namespace

void moe_route(const MoeDeviceRoute& r, const float* logits, const MoeRouteDims& m, cudaStream_t stream) {
  JTOK_CHECK(m.K >= 1 && m.K <= m.E && m.K <= kMaxK, "moe_route: K ", m.K, ", E ", m.E);
  if (m.N == 0) return;
  moe_route_kernel<<<ceil_div(m.N, kThreads), kThreads, 0, stream>>>(r.probs, r.topi, r.topw, logits, m);
  JTOK_CUDA_CHECK_LAUNCH();
}

size_t moe_group_scratch_bytes(const MoeRouteDims& m) {
  const int64_t NK = m.N * m.K;
  return 2 * ints_bytes(NK) + ints_bytes(NK + 1) + ints_bytes(1) + ints_bytes(2 * m.E) + dedup_scratch_bytes(NK, m.E);
}

void moe_group(const MoeDeviceRoute& r, void* scratch, size_t scratch_bytes, const MoeRouteDims& m, cudaStream_t stream) {
  const int64_t NK = m.N * m.K;
  if (NK == 0) return;
  JTOK_CHECK(scratch_bytes >= moe_group_scratch_bytes(m), "moe_group: scratch of ", scratch_bytes, " bytes is short");
  GroupScratch g = carve(scratch, scratch_bytes, NK, m.E);
  if (r.experts) g.rb.unique = r.experts, g.rb.num_unique = r.num_experts;  // the distinct experts, kept
  g.rb.order = r.slot_of;  // the slots sorted by expert, stably: row -> slot
  dedup_ids(g.rb, r.topi, NK, m.E, g.dedup, g.dedup_bytes, stream);
  moe_offsets_kernel<<<ceil_div(m.E + 1, kThreads), kThreads, 0, stream>>>(r.offsets, g.rb.unique, g.rb.offsets,
                                                                           g.rb.num_unique, m.E);
  JTOK_CUDA_CHECK_LAUNCH();
  moe_row_of_kernel<<<ceil_div(NK, kThreads), kThreads, 0, stream>>>(r.row_of, r.slot_of, NK);
  JTOK_CUDA_CHECK_LAUNCH();
  moe_aux_terms_kernel<<<static_cast<int>(m.E), kThreads, 0, stream>>>(g.prob_sums, r, m);
  JTOK_CUDA_CHECK_LAUNCH();
  moe_aux_kernel<<<1, 1, 0, stream>>>(g.prob_sums, r, m);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename T>
void moe_gather(T* xg, const T* x, const MoeDeviceRoute& r, const MoeRouteDims& m, int64_t d, cudaStream_t stream) {
  const int64_t NK = m.N * m.K;
  if (NK * d == 0) return;
  if (vec_fits<T>({xg, x}, {d}))
    moe_gather_vec_kernel<T>
        <<<ceil_div(NK * d / kVec<T>, kThreads), kThreads, 0, stream>>>(xg, x, r.slot_of, NK, m.K, d);
  else
    moe_gather_kernel<T><<<ceil_div(NK * d, kThreads), kThreads, 0, stream>>>(xg, x, r.slot_of, NK, m.K, d);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename T>
void moe_combine(T* out, const T* eo, const MoeDeviceRoute& r, const MoeRouteDims& m, int64_t d, cudaStream_t stream) {
  if (m.N * d == 0) return;
  launch_combine(out, eo, r.row_of, r.topw, m.N, m.K, d, stream);
}

template <typename T>
void moe_combine_backward(T* deo, float* dlogits, const T* dout, const T* eo, const MoeDeviceRoute& r,
                          const MoeRouteDims& m, int64_t d, float aux_grad, cudaStream_t stream) {
  JTOK_CHECK(m.K >= 1 && m.K <= m.E && m.K <= kMaxK, "moe_combine_backward: K ", m.K, ", E ", m.E);
  if (m.N == 0) return;
  const float aux_scale = static_cast<float>(aux_grad * m.aux_coef * static_cast<double>(m.E) / static_cast<double>(m.N));
  moe_combine_backward_kernel<T>
      <<<static_cast<int>(m.N), kThreads, 0, stream>>>(deo, dlogits, dout, eo, r, m, d, aux_scale);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename T>
void moe_scatter_backward(T* dx, const T* dxg, const MoeDeviceRoute& r, const MoeRouteDims& m, int64_t d,
                          cudaStream_t stream) {
  if (m.N * d == 0) return;
  launch_combine(dx, dxg, r.row_of, static_cast<const float*>(nullptr), m.N, m.K, d, stream);
}

#define JTOK_MOE_INSTANTIATE(T)                                                                                    \
  template void moe_gather<T>(T*, const T*, const MoeDeviceRoute&, const MoeRouteDims&, int64_t, cudaStream_t);    \
  template void moe_combine<T>(T*, const T*, const MoeDeviceRoute&, const MoeRouteDims&, int64_t, cudaStream_t);   \
  template void moe_combine_backward<T>(T*, float*, const T*, const T*, const MoeDeviceRoute&, const MoeRouteDims&, \
                                        int64_t, float, cudaStream_t);                                             \
  template void moe_scatter_backward<T>(T*, const T*, const MoeDeviceRoute&, const MoeRouteDims&, int64_t,         \
                                        cudaStream_t);
JTOK_MOE_INSTANTIATE(float)
JTOK_MOE_INSTANTIATE(__nv_bfloat16)
#undef JTOK_MOE_INSTANTIATE

}  // namespace jtok::cuda
