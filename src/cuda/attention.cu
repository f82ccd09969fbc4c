// Causal grouped-query flash attention, forward and backward (FlashAttention-2's algorithm).
//   q (B,T,H,hd), k, v (B,T,KV,hd), out (B,T,H,hd); lse, row_terms (B,H,T) fp32.
// Tiles of kTile query rows against tiles of kTile keys, staged in shared memory as fp32 whatever
// the element type; one block of kWarps warps per tile. In a score tile a warp owns kRowsPerWarp
// query rows and lane j owns key j, so a row's softmax reductions are warp shuffles.
// Forward: one block per (query tile, head, batch), online softmax over the key tiles up to the
// diagonal. Backward: one pass for dq (one block per query tile, looping over key tiles) and one
// for dk, dv (one block per (key tile, kv head), looping over its group's query heads and the query
// tiles from the diagonal on): each gradient element is written by one thread, in a fixed order.
// A lane owns hd / 32 columns of a row (hd 32: one); the tiles' extent over rows and keys is the
// warp width whatever hd is (32, 64 or 128). These are the fp32 path and the bf16 peer; bf16 calls
// run the tensor-core kernels (attention_mma.cu, attention_mma_bwd.cu), which share this file's
// shape checks and row terms.
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "cuda/attention.h"
#include "cuda/attention_mma.h"
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/pdl.cuh"

namespace jtok::cuda {
namespace {

constexpr int kTile = 32;                     // query rows per tile = keys per tile = warp width
constexpr int kWarps = 8;                     // threads per block: kWarps * 32
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = kTile / kWarps;  // score-tile rows (or accumulated keys) per warp

// Butterfly maximum: every lane ends with the same value (warp_sum: cuda/common.cuh).
__device__ inline float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// dst (kTile, HD) with row stride sld = rows [r0, r0 + kTile) of src (row stride ld), zero past T.
template <int HD, typename E>
__device__ void load_tile(float* dst, int sld, const E* src, int64_t ld, int r0, int T) {
  for (int idx = threadIdx.x; idx < kTile * HD; idx += kThreads) {
    const int r = idx / HD, d = idx % HD;
    dst[r * sld + d] = r0 + r < T ? to_f32(src[static_cast<int64_t>(r0 + r) * ld + d]) : 0.0f;
  }
}

// s[ii] = A[row] . Bm[lane] for this warp's rows row = warp * kRowsPerWarp + ii. A (kTile, HD) is
// read by broadcast; Bm (kTile, HD + 1) is padded so the lanes' rows fall in different banks.
template <int HD>
__device__ void warp_dots(float (&s)[kRowsPerWarp], const float* A, const float* Bm) {
  const int row0 = (threadIdx.x / 32) * kRowsPerWarp, lane = threadIdx.x % 32;
#pragma unroll
  for (int ii = 0; ii < kRowsPerWarp; ++ii) s[ii] = 0.0f;
#pragma unroll 8
  for (int d = 0; d < HD; ++d) {
    const float b = Bm[lane * (HD + 1) + d];
#pragma unroll
    for (int ii = 0; ii < kRowsPerWarp; ++ii) s[ii] = fmaf(A[(row0 + ii) * HD + d], b, s[ii]);
  }
}

template <int HD>
constexpr size_t fwd_smem_floats() {
  return kTile * HD + kTile * (HD + 1) + kTile * HD + kTile * kTile;  // Q, K (padded), V, P
}

// The online-softmax step of one score tile for this warp's rows: s (scaled scores, -inf where
// masked) becomes P in Ps, m and l move to the new maximum and o is rescaled to it.
template <int HD>
__device__ void online_softmax_step(float (&o)[kRowsPerWarp][HD / 32], float (&m)[kRowsPerWarp],
                                    float (&l)[kRowsPerWarp], const float (&s)[kRowsPerWarp], float* Ps) {
  const int row0 = (threadIdx.x / 32) * kRowsPerWarp, lane = threadIdx.x % 32;
#pragma unroll
  for (int ii = 0; ii < kRowsPerWarp; ++ii) {
    // Finite: key c0 <= every row of the tile on the first key tile, and m is finite after it.
    const float m_new = fmaxf(m[ii], warp_max(s[ii]));
    const float p = expf(s[ii] - m_new), alpha = expf(m[ii] - m_new);  // alpha 0 on the first tile
    l[ii] = l[ii] * alpha + warp_sum(p);
    m[ii] = m_new;
    Ps[(row0 + ii) * kTile + lane] = p;
#pragma unroll
    for (int dd = 0; dd < HD / 32; ++dd) o[ii][dd] *= alpha;
  }
}

// One block per (query tile, head, batch); the costly late tiles are scheduled first.
template <int HD, typename E>
__global__ void __launch_bounds__(kThreads) attn_fwd(E* out, float* lse, const E* q, const E* k, const E* v, AttnDims n,
                                                     float scale) {
  pdl_wait();
  extern __shared__ float smem[];
  float *Qs = smem, *Ks = Qs + kTile * HD, *Vs = Ks + kTile * (HD + 1), *Ps = Vs + kTile * HD;
  const int r0 = (gridDim.x - 1 - blockIdx.x) * kTile, h = blockIdx.y, b = blockIdx.z, g = h / (n.H / n.KV);
  const int row0 = (threadIdx.x / 32) * kRowsPerWarp, lane = threadIdx.x % 32;
  const int64_t od = static_cast<int64_t>(n.H) * HD, kvd = n.kvs;  // out packed; k, v rows kvd apart
  const E* kg = k + static_cast<int64_t>(b) * n.T * kvd + g * HD;
  const E* vg = v + static_cast<int64_t>(b) * n.T * kvd + g * HD;
  load_tile<HD>(Qs, HD, q + static_cast<int64_t>(b) * n.T * n.qs + h * HD, n.qs, r0, n.T);
  float o[kRowsPerWarp][HD / 32] = {}, m[kRowsPerWarp], l[kRowsPerWarp] = {};
#pragma unroll
  for (int ii = 0; ii < kRowsPerWarp; ++ii) m[ii] = -INFINITY;
  const int last_row = min(r0 + kTile, n.T) - 1;
  for (int c0 = 0; c0 <= last_row; c0 += kTile) {
    __syncthreads();  // the previous tile's K, V, P are read
    load_tile<HD>(Ks, HD + 1, kg, kvd, c0, n.T);
    load_tile<HD>(Vs, HD, vg, kvd, c0, n.T);
    __syncthreads();
    float s[kRowsPerWarp];
    warp_dots<HD>(s, Qs, Ks);
#pragma unroll
    for (int ii = 0; ii < kRowsPerWarp; ++ii) s[ii] = c0 + lane <= r0 + row0 + ii ? s[ii] * scale : -INFINITY;
    online_softmax_step<HD>(o, m, l, s, Ps);
    __syncwarp();  // a warp reads only its own rows of P
    for (int j = 0; j < kTile; ++j)
#pragma unroll
      for (int dd = 0; dd < HD / 32; ++dd) {
        const float vj = Vs[j * HD + lane + 32 * dd];
#pragma unroll
        for (int ii = 0; ii < kRowsPerWarp; ++ii) o[ii][dd] = fmaf(Ps[(row0 + ii) * kTile + j], vj, o[ii][dd]);
      }
  }
#pragma unroll
  for (int ii = 0; ii < kRowsPerWarp; ++ii) {
    const int t = r0 + row0 + ii;
    if (t >= n.T) continue;
    const float inv = 1.0f / l[ii];
    E* orow = out + (static_cast<int64_t>(b) * n.T + t) * od + h * HD;
#pragma unroll
    for (int dd = 0; dd < HD / 32; ++dd) orow[lane + 32 * dd] = from_f32<E>(o[ii][dd] * inv);
    if (lane == 0) lse[(static_cast<int64_t>(b) * n.H + h) * n.T + t] = m[ii] + logf(l[ii]);
  }
}

// row_terms (B,H,T): D = sum_i dout_i out_i per row; one warp per (b, t, h) row.
template <int HD, typename E>
__global__ void __launch_bounds__(kThreads) attn_row_terms(float* D, const E* dout, const E* out, AttnDims n) {
  pdl_wait();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;  // (b * T + t) * H + h
  if (row >= static_cast<int64_t>(n.B) * n.T * n.H) return;
  const int lane = threadIdx.x % 32, h = static_cast<int>(row % n.H);
  const int64_t bt = row / n.H, b = bt / n.T, t = bt % n.T;
  float acc = 0.0f;
#pragma unroll
  for (int dd = 0; dd < HD / 32; ++dd)
    acc = fmaf(to_f32(dout[row * HD + lane + 32 * dd]), to_f32(out[row * HD + lane + 32 * dd]), acc);
  acc = warp_sum(acc);
  if (lane == 0) D[(b * n.H + h) * n.T + t] = acc;
}

template <int HD>
constexpr size_t bwd_smem_floats() {
  return 2 * kTile * (HD + 1) + 2 * kTile * HD + 2 * kTile * kTile;  // K, V (padded), Q, dO, P, dS
}

// The backward's score tile for this warp's rows (query rows r0 + row, keys c0 + lane): P =
// exp(scale q.k - lse) and dS = P (dO.v - D), both 0 where masked (past the diagonal or T), written
// to Ps and dSs (kTile, kTile). lse and D of the rows are read from global memory.
template <int HD>
__device__ void backward_scores(float* Ps, float* dSs, const float* Qs, const float* dOs, const float* Ks,
                                const float* Vs, const float* lse_h, const float* D_h, int r0, int c0, int T,
                                float scale) {
  const int row0 = (threadIdx.x / 32) * kRowsPerWarp, lane = threadIdx.x % 32;
  float s[kRowsPerWarp], dp[kRowsPerWarp];
  warp_dots<HD>(s, Qs, Ks);
  warp_dots<HD>(dp, dOs, Vs);
#pragma unroll
  for (int ii = 0; ii < kRowsPerWarp; ++ii) {
    const int t = r0 + row0 + ii;
    const bool valid = t < T && c0 + lane <= t;
    const float p = valid ? expf(s[ii] * scale - lse_h[t]) : 0.0f;
    Ps[(row0 + ii) * kTile + lane] = p;
    dSs[(row0 + ii) * kTile + lane] = valid ? p * (dp[ii] - D_h[t]) : 0.0f;
  }
}

// dq: one block per (query tile, head, batch), key tiles up to the diagonal in order; each thread
// owns kRowsPerWarp rows x HD / 32 dims of the tile's dq.
template <int HD, typename E>
__global__ void __launch_bounds__(kThreads) attn_bwd_dq(E* dq, const E* dout, const float* lse, const float* D,
                                                        const E* q, const E* k, const E* v, AttnDims n, float scale) {
  pdl_wait();
  extern __shared__ float smem[];
  float *Ks = smem, *Vs = Ks + kTile * (HD + 1), *Qs = Vs + kTile * (HD + 1), *dOs = Qs + kTile * HD;
  float *Ps = dOs + kTile * HD, *dSs = Ps + kTile * kTile;
  const int r0 = (gridDim.x - 1 - blockIdx.x) * kTile, h = blockIdx.y, b = blockIdx.z, g = h / (n.H / n.KV);
  const int row0 = (threadIdx.x / 32) * kRowsPerWarp, lane = threadIdx.x % 32;
  const int64_t od = static_cast<int64_t>(n.H) * HD, qd = n.qs, kvd = n.kvs;  // dout packed, q / dq, k / v strided
  const int64_t q_off = static_cast<int64_t>(b) * n.T * qd + h * HD, kv_off = static_cast<int64_t>(b) * n.T * kvd + g * HD;
  const int64_t row_off = (static_cast<int64_t>(b) * n.H + h) * n.T;
  load_tile<HD>(Qs, HD, q + q_off, qd, r0, n.T);
  load_tile<HD>(dOs, HD, dout + static_cast<int64_t>(b) * n.T * od + h * HD, od, r0, n.T);
  float acc[kRowsPerWarp][HD / 32] = {};
  const int last_row = min(r0 + kTile, n.T) - 1;
  for (int c0 = 0; c0 <= last_row; c0 += kTile) {
    __syncthreads();
    load_tile<HD>(Ks, HD + 1, k + kv_off, kvd, c0, n.T);
    load_tile<HD>(Vs, HD + 1, v + kv_off, kvd, c0, n.T);
    __syncthreads();
    backward_scores<HD>(Ps, dSs, Qs, dOs, Ks, Vs, lse + row_off, D + row_off, r0, c0, n.T, scale);
    __syncwarp();  // a warp reads only its own rows of dS
    for (int j = 0; j < kTile; ++j)
#pragma unroll
      for (int dd = 0; dd < HD / 32; ++dd) {
        const float kj = Ks[j * (HD + 1) + lane + 32 * dd];
#pragma unroll
        for (int ii = 0; ii < kRowsPerWarp; ++ii) acc[ii][dd] = fmaf(dSs[(row0 + ii) * kTile + j], kj, acc[ii][dd]);
      }
  }
#pragma unroll
  for (int ii = 0; ii < kRowsPerWarp; ++ii) {
    const int t = r0 + row0 + ii;
    if (t >= n.T) continue;
    E* row = dq + q_off + static_cast<int64_t>(t) * qd;
#pragma unroll
    for (int dd = 0; dd < HD / 32; ++dd)  // written over: from zero, the bits of zeroing first
      row[lane + 32 * dd] = from_f32<E>((n.accumulate ? to_f32(row[lane + 32 * dd]) : 0.0f) + scale * acc[ii][dd]);
  }
}

// dk, dv: one block per (key tile, kv head, batch); for each query head of the group, the query
// tiles from the diagonal on. Each thread owns kRowsPerWarp keys x HD / 32 dims of dk and dv.
template <int HD, typename E>
__global__ void __launch_bounds__(kThreads) attn_bwd_dkdv(E* dk, E* dv, const E* dout, const float* lse,
                                                          const float* D, const E* q, const E* k, const E* v, AttnDims n,
                                                          float scale) {
  pdl_wait();
  extern __shared__ float smem[];
  float *Ks = smem, *Vs = Ks + kTile * (HD + 1), *Qs = Vs + kTile * (HD + 1), *dOs = Qs + kTile * HD;
  float *Ps = dOs + kTile * HD, *dSs = Ps + kTile * kTile;
  const int c0 = blockIdx.x * kTile, g = blockIdx.y, b = blockIdx.z, group = n.H / n.KV;
  const int key0 = (threadIdx.x / 32) * kRowsPerWarp, lane = threadIdx.x % 32;
  const int64_t od = static_cast<int64_t>(n.H) * HD, qd = n.qs, kvd = n.kvs;  // dout packed, q, k / v / dk / dv strided
  const int64_t kv_off = static_cast<int64_t>(b) * n.T * kvd + g * HD;
  load_tile<HD>(Ks, HD + 1, k + kv_off, kvd, c0, n.T);
  load_tile<HD>(Vs, HD + 1, v + kv_off, kvd, c0, n.T);
  float acc_k[kRowsPerWarp][HD / 32] = {}, acc_v[kRowsPerWarp][HD / 32] = {};
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const int64_t q_off = static_cast<int64_t>(b) * n.T * qd + h * HD, row_off = (static_cast<int64_t>(b) * n.H + h) * n.T;
    const int64_t o_off = static_cast<int64_t>(b) * n.T * od + h * HD;
    for (int r0 = c0; r0 < n.T; r0 += kTile) {  // c0 is a multiple of kTile: the diagonal tile first
      __syncthreads();  // the previous tile's Q, dO, P, dS are read
      load_tile<HD>(Qs, HD, q + q_off, qd, r0, n.T);
      load_tile<HD>(dOs, HD, dout + o_off, od, r0, n.T);
      __syncthreads();
      backward_scores<HD>(Ps, dSs, Qs, dOs, Ks, Vs, lse + row_off, D + row_off, r0, c0, n.T, scale);
      __syncthreads();  // every warp reads every row of P and dS
      for (int i = 0; i < kTile; ++i)
#pragma unroll
        for (int dd = 0; dd < HD / 32; ++dd) {
          const float qi = Qs[i * HD + lane + 32 * dd], doi = dOs[i * HD + lane + 32 * dd];
#pragma unroll
          for (int jj = 0; jj < kRowsPerWarp; ++jj) {
            acc_v[jj][dd] = fmaf(Ps[i * kTile + key0 + jj], doi, acc_v[jj][dd]);
            acc_k[jj][dd] = fmaf(dSs[i * kTile + key0 + jj], qi, acc_k[jj][dd]);
          }
        }
    }
  }
#pragma unroll
  for (int jj = 0; jj < kRowsPerWarp; ++jj) {
    const int j = c0 + key0 + jj;
    if (j >= n.T) continue;
    E *krow = dk + kv_off + static_cast<int64_t>(j) * kvd, *vrow = dv + kv_off + static_cast<int64_t>(j) * kvd;
#pragma unroll
    for (int dd = 0; dd < HD / 32; ++dd) {
      const int d = lane + 32 * dd;
      krow[d] = from_f32<E>((n.accumulate ? to_f32(krow[d]) : 0.0f) + scale * acc_k[jj][dd]);
      vrow[d] = from_f32<E>((n.accumulate ? to_f32(vrow[d]) : 0.0f) + acc_v[jj][dd]);
    }
  }
}

AttnDims check_dims(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, AttnStrides st) {
  if (!attention_head_dim_supported(hd)) fail("cuda attention: head dim ", hd, " is not supported (32, 64 or 128)");
  if (B < 0 || T < 0 || H <= 0 || KV <= 0 || H % KV != 0)
    fail("cuda attention: bad shape B ", B, " T ", T, " H ", H, " KV ", KV, " (KV must divide H)");
  if (B > 65535 || H > 65535 || T > (int64_t{1} << 30))
    fail("cuda attention: shape too large for the grid: B ", B, " T ", T, " H ", H);
  const int64_t qs = st.q ? st.q : H * hd, kvs = st.kv ? st.kv : KV * hd;
  if (qs < H * hd || kvs < KV * hd)
    fail("cuda attention: token strides q ", qs, " kv ", kvs, " are shorter than the rows (", H * hd, ", ", KV * hd, ")");
  return AttnDims{static_cast<int>(B), static_cast<int>(T), static_cast<int>(H), static_cast<int>(KV), qs, kvs};
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  JTOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <int HD, typename E>
void launch_forward(E* out, float* lse, const E* q, const E* k, const E* v, AttnDims n, cudaStream_t stream) {
  static_assert(HD % 32 == 0, "a lane owns HD / 32 columns of a row");
  const size_t smem = fwd_smem_floats<HD>() * sizeof(float);
  allow_smem(attn_fwd<HD, E>, smem);
  const dim3 grid((n.T + kTile - 1) / kTile, n.H, n.B);
  attn_fwd<HD, E><<<grid, kThreads, smem, stream>>>(out, lse, q, k, v, n, 1.0f / std::sqrt(static_cast<float>(HD)));
  JTOK_CUDA_CHECK_LAUNCH();
}

template <int HD, typename E>
void launch_row_terms(float* D, const E* dout, const E* out, AttnDims n, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(n.B) * n.T * n.H;
  attn_row_terms<HD, E><<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(D, dout, out, n);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <int HD, typename E>
void launch_backward(E* dq, E* dk, E* dv, const float* D, const E* dout, const float* lse, const E* q, const E* k,
                     const E* v, AttnDims n, cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const size_t smem = bwd_smem_floats<HD>() * sizeof(float);
  const unsigned tiles = static_cast<unsigned>((n.T + kTile - 1) / kTile);
  allow_smem(attn_bwd_dq<HD, E>, smem);
  attn_bwd_dq<HD, E><<<dim3(tiles, n.H, n.B), kThreads, smem, stream>>>(dq, dout, lse, D, q, k, v, n, scale);
  JTOK_CUDA_CHECK_LAUNCH();
  allow_smem(attn_bwd_dkdv<HD, E>, smem);
  attn_bwd_dkdv<HD, E><<<dim3(tiles, n.KV, n.B), kThreads, smem, stream>>>(dk, dv, dout, lse, D, q, k, v, n, scale);
  JTOK_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename E>
void attention_forward(E* out, float* lse, const E* q, const E* k, const E* v, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t hd, cudaStream_t stream, AttnStrides strides) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>) {
    const AttnDims n = check_dims(B, T, H, KV, hd, strides);
    if (n.B > 0 && n.T > 0) attention_forward_mma(out, lse, q, k, v, n, static_cast<int>(hd), stream);
  } else {
    attention_forward_tiles(out, lse, q, k, v, B, T, H, KV, hd, stream, strides);
  }
}

void attention_forward_wide(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                            const __nv_bfloat16* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                            cudaStream_t stream, AttnStrides strides) {
  const AttnDims n = check_dims(B, T, H, KV, hd, strides);
  if (n.B > 0 && n.T > 0) attention_forward_mma(out, lse, q, k, v, n, static_cast<int>(hd), stream, 32);
}

template <typename E>
void attention_forward_tiles(E* out, float* lse, const E* q, const E* k, const E* v, int64_t B, int64_t T, int64_t H,
                             int64_t KV, int64_t hd, cudaStream_t stream, AttnStrides strides) {
  const AttnDims n = check_dims(B, T, H, KV, hd, strides);
  if (n.B == 0 || n.T == 0) return;
  with_head_dim(hd, [&](auto d) { launch_forward<decltype(d)::value>(out, lse, q, k, v, n, stream); });
}

namespace {

// The bf16 backward on the tensor cores: the row terms, then dq (dq_rows_per_warp 16 or 32) and dk dv.
bool backward_mma(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv, float* row_terms, const __nv_bfloat16* dout,
                  const __nv_bfloat16* out, const float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                  const __nv_bfloat16* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, cudaStream_t stream,
                  AttnStrides strides, bool accumulate, const RopeTables& rope, int dq_rows_per_warp) {
  AttnDims n = check_dims(B, T, H, KV, hd, strides);
  n.accumulate = accumulate;
  n.rope_cos = rope.cos, n.rope_sin = rope.sin;
  JTOK_CHECK(!rope.cos == !rope.sin, "cuda attention backward: RoPE's cos table without its sin, or the reverse");
  if (n.B == 0 || n.T == 0) return rope.cos != nullptr;
  with_head_dim(hd, [&](auto d) { launch_row_terms<decltype(d)::value>(row_terms, dout, out, n, stream); });
  attention_backward_mma(dq, dk, dv, row_terms, dout, lse, q, k, v, n, static_cast<int>(hd), stream, dq_rows_per_warp);
  return rope.cos != nullptr;
}

}  // namespace

bool attention_backward_wide(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv, float* row_terms,
                             const __nv_bfloat16* dout, const __nv_bfloat16* out, const float* lse,
                             const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int64_t B,
                             int64_t T, int64_t H, int64_t KV, int64_t hd, cudaStream_t stream, AttnStrides strides,
                             bool accumulate, const RopeTables& rope) {
  return backward_mma(dq, dk, dv, row_terms, dout, out, lse, q, k, v, B, T, H, KV, hd, stream, strides, accumulate,
                      rope, 32);
}

template <typename E>
bool attention_backward(E* dq, E* dk, E* dv, float* row_terms, const E* dout, const E* out, const float* lse,
                        const E* q, const E* k, const E* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                        cudaStream_t stream, AttnStrides strides, bool accumulate, const RopeTables& rope) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>) {
    return backward_mma(dq, dk, dv, row_terms, dout, out, lse, q, k, v, B, T, H, KV, hd, stream, strides, accumulate,
                        rope, 16);
  } else {
    attention_backward_tiles(dq, dk, dv, row_terms, dout, out, lse, q, k, v, B, T, H, KV, hd, stream, strides,
                             accumulate);
    return false;
  }
}

template <typename E>
void attention_backward_tiles(E* dq, E* dk, E* dv, float* row_terms, const E* dout, const E* out, const float* lse,
                              const E* q, const E* k, const E* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                              int64_t hd, cudaStream_t stream, AttnStrides strides, bool accumulate) {
  AttnDims n = check_dims(B, T, H, KV, hd, strides);
  n.accumulate = accumulate;
  if (n.B == 0 || n.T == 0) return;
  with_head_dim(hd, [&](auto d) {
    constexpr int HD = decltype(d)::value;
    launch_row_terms<HD>(row_terms, dout, out, n, stream);
    launch_backward<HD>(dq, dk, dv, row_terms, dout, lse, q, k, v, n, stream);
  });
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*, int64_t, int64_t,
                                       int64_t, int64_t, int64_t, cudaStream_t, AttnStrides);
template void attention_forward<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*, const __nv_bfloat16*,
                                               const __nv_bfloat16*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                               cudaStream_t, AttnStrides);
template void attention_forward_tiles<float>(float*, float*, const float*, const float*, const float*, int64_t,
                                             int64_t, int64_t, int64_t, int64_t, cudaStream_t, AttnStrides);
template void attention_forward_tiles<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*,
                                                     const __nv_bfloat16*, const __nv_bfloat16*, int64_t, int64_t,
                                                     int64_t, int64_t, int64_t, cudaStream_t, AttnStrides);
template bool attention_backward<float>(float*, float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                        int64_t, cudaStream_t, AttnStrides, bool, const RopeTables&);
template bool attention_backward<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, float*,
                                                const __nv_bfloat16*, const __nv_bfloat16*, const float*,
                                                const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                                int64_t, int64_t, int64_t, int64_t, int64_t, cudaStream_t, AttnStrides,
                                                bool, const RopeTables&);

template void attention_backward_tiles<float>(float*, float*, float*, float*, const float*, const float*, const float*,
                                              const float*, const float*, const float*, int64_t, int64_t, int64_t,
                                              int64_t, int64_t, cudaStream_t, AttnStrides, bool);
template void attention_backward_tiles<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, float*,
                                                      const __nv_bfloat16*, const __nv_bfloat16*, const float*,
                                                      const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                                      int64_t, int64_t, int64_t, int64_t, int64_t, cudaStream_t,
                                                      AttnStrides, bool);

}  // namespace jtok::cuda
