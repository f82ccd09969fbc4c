// The bf16 attention backward on the tensor cores (FlashAttention-2's algorithm, no atomics).
//   q, dout, dq (B,T,H,hd), k, v, dk, dv (B,T,KV,hd) bf16; lse, row_terms D (B,H,T) fp32.
// Two kernels; each gradient element is written by one thread, summed in a fixed order:
//  dk, dv: one block per (kKeyBlock keys, kv head, batch), a warp per 16 keys, its dk and dv in
//    registers, and its keys and values as A fragments read from shared memory once (a fifth of the
//    loop's shared-memory reads at hd 64: 16 KB a query tile and warp where it was 20). For each
//    query head of the group and each tile of kQTile queries from the diagonal on: S^T = K Q^T and
//    dP^T = V dO^T (keys x queries), P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - D), then
//    dV += P^T dO and dK += dS^T Q (P^T and dS^T rounded to bf16 as operands).
//  dq: one block per (kQBlock query rows, head, batch), a warp per 16 rows (or 32, two m16 tiles
//    sharing each K and V fragment: attention_backward_wide); for each key tile up to its rows:
//    S = Q K^T, dP = dO V^T, dS as above, dQ += dS K.
// Both recompute the scores (the price of no atomics: ~1.4x the flops of FlashAttention-2's single
// pass with an atomic dq). Both stage their loop's tiles twice over in shared memory, the next one's
// cp.async copies running under this one's products, and skip the causal test on the tiles it
// cannot cut (the same bits).
#include <cmath>

#include "cuda/attention_mma.h"
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/mma_bf16.cuh"
#include "cuda/pdl.cuh"

namespace jtok::cuda {
namespace {

using mma::bf16;
using mma::kRowStride;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kKeyBlock = 16 * kWarps;  // keys per dk/dv block
constexpr int kQTile = 32;              // queries per step of the dk/dv loop (divides kKeyBlock)
constexpr int kKeyTile = 32;            // keys per step of the dq loop
// dq's MT m16 tiles of query rows a warp (1: 16 rows; 2: 32, attention_backward_wide's: each K and V
// fragment read from shared memory feeds MT products).
template <int MT>
constexpr int kQBlock = kWarps * 16 * MT;  // query rows per dq block
// dk dv blocks an SM by registers (__launch_bounds__): with its keys' and values' fragments held for the
// whole loop, ptxas would take 128 / 173 / 255 registers at hd 32 / 64 / 128, hd 64 then fitting 2
// blocks an SM where 131 fitted 3; capped at 128 / 168 they keep 4 / 3.
template <int HD>
constexpr int kDkdvBlocksPerSm = HD == 32 ? 4 : (HD == 64 ? 3 : 1);

// x = y = 0 (C fragments).
template <int N>
__device__ void zero_pair(float (&x)[N / 8][4], float (&y)[N / 8][4]) {
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[nt][e] = y[nt][e] = 0.0f;
}

// x = ax . Bx^T and y = ay . By^T over every head dim, as N / 8 C fragments (16 x N): dk dv's scores and
// their gradient's tile (keys x queries) for this warp, from its keys' and values' A fragments held in
// registers for the whole loop; Bx, By are row-major (N, HD) tiles (rows are the columns of x).
template <int HD, int N>
__device__ void score_pair(float (&x)[N / 8][4], float (&y)[N / 8][4], const uint32_t (&ax)[HD / 16][4],
                           const uint32_t (&ay)[HD / 16][4], const bf16* Bx, const bf16* By) {
  constexpr int ld = kRowStride<HD>;
  zero_pair<N>(x, y);
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt) {
      mma::mma_rows_t(x[nt], ax[kk], Bx, ld, 8 * nt, 16 * kk);
      mma::mma_rows_t(y[nt], ay[kk], By, ld, 8 * nt, 16 * kk);
    }
}

// One score: s becomes P = exp(scale s - lse) = 2^(scale_log2 s - lse2) (lse2 = lse log2(e), mma_bf16.cuh),
// dp becomes dS = P (dp - D); both 0 unless valid (causal and inside T; lse2 and D are not read then).
__device__ inline void probs_and_grad(float& s, float& dp, bool valid, float scale_log2, const float& lse2,
                                      const float& D) {
  const float p = valid ? exp2f(s * scale_log2 - lse2) : 0.0f;
  dp = valid ? p * (dp - D) : 0.0f;
  s = p;
}

// rows (bf16, row stride ld) r and r + 8 of a warp's 16-row C fragments += scale acc (without
// accumulate: = scale acc, from zero), rows < T only. Given RoPE's (T, HD / 2) tables cos, sin (dq's and
// dk's rows, AttnDims::rope_cos), through RoPE's inverse at each row's position (the rows are positions
// 0..T-1): column j < HD / 2 (fragment nt, a thread's 2t, 2t + 1) pairs with j + HD / 2 (fragment nt +
// HD / 16, the same thread), rotated by (cos, -sin) in fp32 (common.cuh's rope_rotate, as rope_backward)
// before the one rounding to bf16.
template <int HD>
__device__ void add_rows(bf16* base, int64_t ld, int row_a, int T, float scale, const float (&acc)[HD / 8][4],
                         bool accumulate, const float* cos = nullptr, const float* sin = nullptr) {
  constexpr int half = HD / 2;
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row_a + 8 * i;
    if (row >= T) continue;
    bf16* r = base + static_cast<int64_t>(row) * ld + 2 * t;
    if (!cos) {
#pragma unroll
      for (int nt = 0; nt < HD / 8; ++nt)
        mma::add_pair(r + 8 * nt, scale, acc[nt][2 * i], acc[nt][2 * i + 1], accumulate);
      continue;
    }
    const float *c = cos + static_cast<int64_t>(row) * half + 2 * t,
                *s = sin + static_cast<int64_t>(row) * half + 2 * t;
#pragma unroll
    for (int nt = 0; nt < HD / 16; ++nt) {
      float lo[2], hi[2];  // columns 8 nt + 2t + e and HD / 2 on
#pragma unroll
      for (int e = 0; e < 2; ++e)
        rope_rotate(scale * acc[nt][2 * i + e], scale * acc[nt + HD / 16][2 * i + e], c[8 * nt + e], -s[8 * nt + e],
                    lo[e], hi[e]);
      mma::add_pair(r + 8 * nt, 1.0f, lo[0], lo[1], accumulate);
      mma::add_pair(r + 8 * nt + half, 1.0f, hi[0], hi[1], accumulate);
    }
  }
}

// A dk/dv block's stage: kQTile query rows of Q and dO (row stride kRowStride<HD>), then their lse
// and D (fp32), filled by cp.async.
template <int HD>
struct QueryStage {
  static constexpr int bytes = 2 * kQTile * kRowStride<HD> * sizeof(bf16) + 2 * kQTile * sizeof(float);
  bf16 *Qs, *dOs;
  float *lse, *D;
  __device__ explicit QueryStage(unsigned char* at)
      : Qs(reinterpret_cast<bf16*>(at)),
        dOs(Qs + kQTile * kRowStride<HD>),
        lse(reinterpret_cast<float*>(dOs + kQTile * kRowStride<HD>)),
        D(lse + kQTile) {}
};

// Queries r0 .. r0 + kQTile of head h into stage st (rows past T: zeros), into the open cp.async group.
template <int HD>
__device__ void load_queries(const QueryStage<HD>& st, const bf16* dout, const float* lse, const float* D,
                             const bf16* q, const AttnDims& n, int b, int h, int r0) {
  const int64_t od = static_cast<int64_t>(n.H) * HD, row_off = (static_cast<int64_t>(b) * n.H + h) * n.T;
  mma::load_tile_async<HD, kThreads>(st.Qs, q + static_cast<int64_t>(b) * n.T * n.qs + h * HD, n.qs, r0, kQTile, n.T);
  mma::load_tile_async<HD, kThreads>(st.dOs, dout + static_cast<int64_t>(b) * n.T * od + h * HD, od, r0, kQTile, n.T);
  if (threadIdx.x < kQTile) {
    const int r = r0 + threadIdx.x, in = r < n.T ? 4 : 0;
    mma::cp_async_4(st.lse + threadIdx.x, lse + row_off + (in ? r : 0), in);
    mma::cp_async_4(st.D + threadIdx.x, D + row_off + (in ? r : 0), in);
  }
}

// One query tile from r0 onto a warp's dk, dv (keys key_a, key_a + 8). Masked false: every query of
// the tile is at least every key of the warp and below T, so the test is left out (the same bits).
template <int HD, bool Masked>
__device__ void dkdv_tile(float (&acc_k)[1][HD / 8][4], float (&acc_v)[1][HD / 8][4], const QueryStage<HD>& st,
                          const uint32_t (&kf)[HD / 16][4], const uint32_t (&vf)[HD / 16][4], int key_a, int r0, int T,
                          float scale) {
  const int t = threadIdx.x % 4;
  float s[1][kQTile / 8][4], dp[1][kQTile / 8][4];  // keys x queries (one m-tile of keys)
  score_pair<HD, kQTile>(s[0], dp[0], kf, vf, st.Qs, st.dOs);
#pragma unroll
  for (int nt = 0; nt < kQTile / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int ql = 8 * nt + 2 * t + (e & 1), query = r0 + ql, key = key_a + 8 * (e >> 1);
      probs_and_grad(s[0][nt][e], dp[0][nt][e], !Masked || (query >= key && query < T), scale * mma::kLog2e,
                     st.lse[ql] * mma::kLog2e, st.D[ql]);
    }
  mma::accumulate_tiles<HD, kQTile, 1>(acc_v, s, st.dOs);
  mma::accumulate_tiles<HD, kQTile, 1>(acc_k, dp, st.Qs);
}

// Shared memory: Ks, Vs (kKeyBlock keys), then two QueryStages: the next query tile's copies run
// under this one's products. The tiles run over the group's heads, each from the diagonal (c0) on.
template <int HD>
__global__ void __launch_bounds__(kThreads, kDkdvBlocksPerSm<HD>)
    attn_bwd_dkdv_mma(bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* D, const bf16* q,
                      const bf16* k, const bf16* v, AttnDims n, float scale) {
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int ld = kRowStride<HD>;
  bf16 *Ks = reinterpret_cast<bf16*>(smem_raw), *Vs = Ks + kKeyBlock * ld;
  unsigned char* stages = reinterpret_cast<unsigned char*>(Vs + kKeyBlock * ld);
  const int T = n.T, c0 = blockIdx.x * kKeyBlock, kvh = blockIdx.y, b = blockIdx.z, group = n.H / n.KV;
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4;
  const int64_t kvd = n.kvs, kv_off = static_cast<int64_t>(b) * T * kvd + kvh * HD;
  const int per_head = (T - c0 + kQTile - 1) / kQTile, tiles = group * per_head;  // queries before c0 see none
  mma::load_kv_async<HD, kThreads>(Ks, k + kv_off, v + kv_off, kvd, c0, kKeyBlock, T);  // Ks, then Vs
  mma::cp_async_commit();
  load_queries<HD>(QueryStage<HD>(stages), dout, lse, D, q, n, b, kvh * group, c0);
  mma::cp_async_commit();
  mma::cp_async_wait<1>();  // K and V landed; the first query tile may still be on its way
  __syncthreads();
  // The warp's 16 keys and values as A fragments, read once: every tile's products use them.
  uint32_t kf[HD / 16][4], vf[HD / 16][4];
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    mma::load_a(kf[kk], Ks, ld, warp * 16, 16 * kk);
    mma::load_a(vf[kk], Vs, ld, warp * 16, 16 * kk);
  }
  float acc_k[1][HD / 8][4] = {}, acc_v[1][HD / 8][4] = {};
  const int key_a = c0 + warp * 16 + g, warp_last_key = c0 + warp * 16 + 15;  // this thread's: key_a, key_a + 8
  for (int j = 0; j < tiles; ++j) {
    const QueryStage<HD> cur(stages + (j & 1) * QueryStage<HD>::bytes);
    if (j + 1 < tiles)  // into the other stage, which every warp is done with
      load_queries<HD>(QueryStage<HD>(stages + ((j + 1) & 1) * QueryStage<HD>::bytes), dout, lse, D, q, n, b,
                       kvh * group + (j + 1) / per_head, c0 + (j + 1) % per_head * kQTile);
    mma::cp_async_commit();   // (empty in the last pass: wait<1> means the same in every pass)
    mma::cp_async_wait<1>();  // this thread's copies of tile j
    __syncthreads();          // everyone's
    const int r0 = c0 + j % per_head * kQTile;
    if (r0 >= warp_last_key && r0 + kQTile <= T)
      dkdv_tile<HD, false>(acc_k, acc_v, cur, kf, vf, key_a, r0, T, scale);
    else
      dkdv_tile<HD, true>(acc_k, acc_v, cur, kf, vf, key_a, r0, T, scale);
    __syncthreads();  // every warp is done with tile j's stage before tile j + 2's copies start
  }
  add_rows<HD>(dk + kv_off, kvd, key_a, T, scale, acc_k[0], n.accumulate, n.rope_cos, n.rope_sin);
  add_rows<HD>(dv + kv_off, kvd, key_a, T, 1.0f, acc_v[0], n.accumulate);
}

// s[mt] = Q . K^T and dp[mt] = dO . V^T (16 x kKeyTile each, rows x keys) for the warp's MT m-tiles of
// rows from row0 (of the block's Qs, dOs): each K and V fragment is loaded once for the MT tiles, each
// tile's A fragments step by step.
template <int HD, int MT>
__device__ void dq_scores(float (&s)[MT][kKeyTile / 8][4], float (&dp)[MT][kKeyTile / 8][4], const bf16* Qs,
                          const bf16* dOs, const bf16* Ks, const bf16* Vs, int row0) {
  constexpr int ld = kRowStride<HD>;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) zero_pair<kKeyTile>(s[mt], dp[mt]);
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    uint32_t aq[MT][4], ad[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      mma::load_a(aq[mt], Qs, ld, row0 + 16 * mt, 16 * kk);
      mma::load_a(ad[mt], dOs, ld, row0 + 16 * mt, 16 * kk);
    }
#pragma unroll
    for (int nt = 0; nt < kKeyTile / 8; ++nt) {
      uint32_t k0, k1, v0, v1;
      mma::load_b_rows_t(k0, k1, Ks, ld, 8 * nt, 16 * kk);
      mma::load_b_rows_t(v0, v1, Vs, ld, 8 * nt, 16 * kk);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma::mma_bf16(s[mt][nt], aq[mt], k0, k1);
        mma::mma_bf16(dp[mt][nt], ad[mt], v0, v1);
      }
    }
  }
}

// One m-tile's P and dS from its scores (rows row_a, row_a + 8; lse in base 2). Masked false: every key
// of the tile is at most every row of the m-tile and the rows are below T.
template <bool Masked>
__device__ void dq_probs(float (&s)[kKeyTile / 8][4], float (&dp)[kKeyTile / 8][4], int row_a, int c0, int T,
                         float scale, const float (&lse_r)[2], const float (&D_r)[2]) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int nt = 0; nt < kKeyTile / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = c0 + 8 * nt + 2 * t + (e & 1), row = row_a + 8 * (e >> 1);
      probs_and_grad(s[nt][e], dp[nt][e], !Masked || (key <= row && row < T), scale * mma::kLog2e, lse_r[e >> 1],
                     D_r[e >> 1]);
    }
}

// A warp's dq: its MT m-tiles' sums and their rows' lse (base 2) and D.
template <int HD, int MT>
struct DqRows {
  float acc[MT][HD / 8][4] = {};
  float lse[MT][2], D[MT][2];
};

// One key tile from c0 (Ks, Vs) onto a warp's dq (tile mt: rows row_a + 16 mt, and + 8).
template <int HD, int MT>
__device__ void dq_tile(DqRows<HD, MT>& w, const bf16* Qs, const bf16* dOs, const bf16* Ks, const bf16* Vs, int row_a,
                        int c0, int T, float scale) {
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4;
  float s[MT][kKeyTile / 8][4], dp[MT][kKeyTile / 8][4];  // rows x keys
  dq_scores<HD, MT>(s, dp, Qs, dOs, Ks, Vs, warp * 16 * MT);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int rows_a = row_a + 16 * mt, tile_row0 = rows_a - g;
    if (c0 + kKeyTile - 1 <= tile_row0 && tile_row0 + 15 < T)
      dq_probs<false>(s[mt], dp[mt], rows_a, c0, T, scale, w.lse[mt], w.D[mt]);
    else
      dq_probs<true>(s[mt], dp[mt], rows_a, c0, T, scale, w.lse[mt], w.D[mt]);
  }
  mma::accumulate_tiles<HD, kKeyTile, MT>(w.acc, dp, Ks);  // dq += dS K
}

// Shared memory: Qs, dOs (kQBlock<MT> rows), then two stages of Ks, Vs (kKeyTile keys each): the next key
// tile's copies run under this one's products. A warp skips the key tiles past its last row (every key
// there is masked for it: its sums gain only zeros).
template <int HD, int MT>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_mma(bf16* dq, const bf16* dout, const float* lse, const float* D, const bf16* q, const bf16* k,
                    const bf16* v, AttnDims n, float scale) {
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int ld = kRowStride<HD>, stage = 2 * kKeyTile * ld, rows = kQBlock<MT>;  // a stage: Ks then Vs
  bf16 *Qs = reinterpret_cast<bf16*>(smem_raw), *dOs = Qs + rows * ld, *KVs = dOs + rows * ld;
  const int T = n.T, H = n.H;
  const int r0 = (gridDim.x - 1 - blockIdx.x) * rows, h = blockIdx.y, b = blockIdx.z, kvh = h / (H / n.KV);
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4;
  const int64_t od = static_cast<int64_t>(H) * HD, qd = n.qs, kvd = n.kvs;  // dout packed; q / dq, k / v strided
  const int64_t q_off = static_cast<int64_t>(b) * T * qd + h * HD, kv_off = static_cast<int64_t>(b) * T * kvd + kvh * HD;
  const int64_t row_off = (static_cast<int64_t>(b) * H + h) * T;
  mma::load_tile_async<HD, kThreads>(Qs, q + q_off, qd, r0, rows, T);
  mma::load_tile_async<HD, kThreads>(dOs, dout + static_cast<int64_t>(b) * T * od + h * HD, od, r0, rows, T);
  mma::load_kv_async<HD, kThreads>(KVs, k + kv_off, v + kv_off, kvd, 0, kKeyTile, T);
  mma::cp_async_commit();
  const int warp_row0 = r0 + warp * 16 * MT, row_a = warp_row0 + g;  // tile mt's rows: row_a + 16 mt, and + 8
  DqRows<HD, MT> w;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = row_a + 16 * mt + 8 * i;
      w.lse[mt][i] = row < T ? lse[row_off + row] * mma::kLog2e : 0.0f;
      w.D[mt][i] = row < T ? D[row_off + row] : 0.0f;
    }
  const int last_row = min(r0 + rows, T) - 1;
  for (int c0 = 0, i = 0; c0 <= last_row; c0 += kKeyTile, ++i) {
    const bf16* cur = KVs + (i & 1) * stage;
    if (c0 + kKeyTile <= last_row)  // tile i + 1 into the other stage, which every warp is done with
      mma::load_kv_async<HD, kThreads>(KVs + ((i + 1) & 1) * stage, k + kv_off, v + kv_off, kvd, c0 + kKeyTile,
                                       kKeyTile, T);
    mma::cp_async_commit();   // (empty in the last pass: wait<1> means the same in every pass)
    mma::cp_async_wait<1>();  // this thread's copies of tile i (and of Q, dO)
    __syncthreads();          // everyone's
    if (c0 <= warp_row0 + 16 * MT - 1) dq_tile<HD, MT>(w, Qs, dOs, cur, cur + kKeyTile * ld, row_a, c0, T, scale);
    __syncthreads();  // every warp is done with tile i's stage before tile i + 2's copies start
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    add_rows<HD>(dq + q_off, qd, row_a + 16 * mt, T, scale, w.acc[mt], n.accumulate, n.rope_cos, n.rope_sin);
}

template <int HD, int MT>
void launch_dq(bf16* dq, const float* D, const bf16* dout, const float* lse, const bf16* q, const bf16* k,
               const bf16* v, const AttnDims& n, float scale, cudaStream_t stream) {
  const size_t smem = (2 * kQBlock<MT> + 4 * kKeyTile) * kRowStride<HD> * sizeof(bf16);  // Q, dO, 2 x (K, V)
  JTOK_CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_mma<HD, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  attn_bwd_dq_mma<HD, MT><<<dim3((n.T + kQBlock<MT> - 1) / kQBlock<MT>, n.H, n.B), kThreads, smem, stream>>>(
      dq, dout, lse, D, q, k, v, n, scale);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <int HD>
void launch(bf16* dq, bf16* dk, bf16* dv, const float* D, const bf16* dout, const float* lse, const bf16* q,
            const bf16* k, const bf16* v, const AttnDims& n, int dq_rows_per_warp, cudaStream_t stream) {
  static_assert(HD % 16 == 0, "the score products run in mma k-steps of 16 head dims");
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  with_m_tiles<HD>(dq_rows_per_warp, "cuda attention backward's dq",
                   [&](auto mt) { launch_dq<HD, decltype(mt)::value>(dq, D, dout, lse, q, k, v, n, scale, stream); });
  const size_t smem_kv = 2 * kKeyBlock * kRowStride<HD> * sizeof(bf16) + 2 * QueryStage<HD>::bytes;  // K, V, 2 x stages
  JTOK_CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_mma<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem_kv)));
  attn_bwd_dkdv_mma<HD><<<dim3((n.T + kKeyBlock - 1) / kKeyBlock, n.KV, n.B), kThreads, smem_kv, stream>>>(
      dk, dv, dout, lse, D, q, k, v, n, scale);
  JTOK_CUDA_CHECK_LAUNCH();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void attention_backward_mma(bf16* dq, bf16* dk, bf16* dv, const float* row_terms, const bf16* dout, const float* lse,
                            const bf16* q, const bf16* k, const bf16* v, const AttnDims& n, int hd, cudaStream_t stream,
                            int dq_rows_per_warp) {
  // dq, dk, dv too: add_pair reads and writes them two elements (4 bytes) at a time.
  if (!aligned16(dout) || !aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(dq) || !aligned16(dk) ||
      !aligned16(dv) || n.qs % 8 != 0 || n.kvs % 8 != 0)
    fail(
        "cuda attention backward: bf16 q, k, v, dout, dq, dk and dv must be 16-byte aligned with token strides a "
        "multiple of 8 (q ",
        n.qs, ", kv ", n.kvs, ")");
  with_head_dim(hd, [&](auto d) {
    launch<decltype(d)::value>(dq, dk, dv, row_terms, dout, lse, q, k, v, n, dq_rows_per_warp, stream);
  });
}

}  // namespace jtok::cuda
