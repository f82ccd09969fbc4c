// The bf16 attention forward on the tensor cores (FlashAttention-2's algorithm).
//   q (B,T,H,hd), k, v (B,T,KV,hd), out (B,T,H,hd) bf16; lse (B,H,T) fp32.
// One block of kWarps warps per (tile of kRows query rows, head, batch); each warp owns 16 query
// rows and keeps their q, scores, running max / sum and output in registers, as the fragments of
// mma.sync.m16n8k16 (bf16 x bf16, fp32 accumulate). K and V tiles of kKeys keys are staged in
// shared memory (rows padded by 8 elements: the fragment loads fall in distinct banks), two stages:
// the next tile's cp.async copies run under this tile's products. The tiles left of the diagonal
// skip the causal test (softmax_fragments<false>).
// The tiles' extent over rows and keys does not depend on hd (32, 64 or 128): hd 32 only holds half
// the q and output fragments and less shared memory, and at short T (the MoE bench: T 128, 4 heads,
// B 16: 128 blocks) larger row tiles would leave SMs idle (T / kRows x H x B blocks).
// Fragment layouts: cuda/mma_bf16.cuh; a C fragment of scores is already the A fragment of P for
// the product P V (FlashAttention-2).
#include <cmath>

#include "cuda/attention_mma.h"
#include "cuda/check.h"
#include "cuda/mma_bf16.cuh"
#include "cuda/pdl.cuh"

namespace jtok::cuda {
namespace {

using mma::bf16;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16 * kWarps;  // query rows per block
constexpr int kKeys = 64;           // keys per tile

using mma::kRowStride;
using mma::mma_bf16;

// s (16 x kKeys, as kKeys / 8 C fragments) = this warp's q rows . the tile's keys.
template <int HD>
__device__ void score_fragments(float (&s)[kKeys / 8][4], const uint32_t (&qf)[HD / 16][4], const bf16* Ks) {
#pragma unroll
  for (int nt = 0; nt < kKeys / 8; ++nt) {
    s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) mma::mma_rows_t(s[nt], qf[kk], Ks, kRowStride<HD>, 8 * nt, 16 * kk);
  }
}

// Masks (key past the row or past T), scales by scale_log2 = scale log2(e), and turns s into P =
// 2^(s - m_new) with the online softmax's running max m (base 2) and sum l of this thread's two
// rows (row g: i = 0, row g + 8: i = 1); the four lanes of a row group (same g) hold one row between
// them. Returns the rescale factors in alpha. Masked false: the caller knows every key of the tile
// is at most every row of the warp and below T (the tiles left of the diagonal), so the test is left
// out: the same bits as with it.
template <bool Masked>
__device__ void softmax_fragments(float (&s)[kKeys / 8][4], float (&m)[2], float (&l)[2], float (&alpha)[2], int row_a,
                                  int c0, int T, float scale_log2) {
  const int t = threadIdx.x % 4;
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = c0 + 8 * nt + 2 * t + (e & 1), row = row_a + 8 * (e >> 1);
      s[nt][e] = !Masked || (key <= row && key < T) ? s[nt][e] * scale_log2 : -INFINITY;
      mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
    }
  float sum[2] = {0.0f, 0.0f}, m_new[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    m_new[i] = fmaxf(m[i], mx[i]);  // finite: key 0 is in every row's first tile
    alpha[i] = exp2f(m[i] - m_new[i]);
  }
#pragma unroll
  for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = exp2f(s[nt][e] - m_new[e >> 1]);
      sum[e >> 1] += s[nt][e];
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 1);
    sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 2);
    l[i] = l[i] * alpha[i] + sum[i];
    m[i] = m_new[i];
  }
}

// o (16 x HD, as HD / 8 C fragments) += P (16 x kKeys, rounded to bf16) V (kKeys x HD).
template <int HD>
__device__ void accumulate_pv(float (&o)[HD / 8][4], const float (&p)[kKeys / 8][4], const bf16* Vs) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    uint32_t pa[4];
    mma::a_from_c(pa, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) mma::mma_rows(o[nt], pa, Vs, kRowStride<HD>, 16 * kk, 8 * nt);
  }
}

// One tile of kKeys keys from c0 (staged in Ks, Vs) onto the warp's running softmax and output.
template <int HD>
__device__ void attend_tile(float (&o)[HD / 8][4], float (&m)[2], float (&l)[2], const uint32_t (&qf)[HD / 16][4],
                            const bf16* Ks, const bf16* Vs, int row_a, int c0, int T, float scale_log2) {
  float s[kKeys / 8][4], alpha[2];
  score_fragments<HD>(s, qf, Ks);
  const int warp_row0 = row_a - (threadIdx.x % 32) / 4;  // the warp's first row
  if (c0 + kKeys - 1 <= warp_row0 && c0 + kKeys <= T)
    softmax_fragments<false>(s, m, l, alpha, row_a, c0, T, scale_log2);
  else
    softmax_fragments<true>(s, m, l, alpha, row_a, c0, T, scale_log2);
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) {
    o[nt][0] *= alpha[0], o[nt][1] *= alpha[0];
    o[nt][2] *= alpha[1], o[nt][3] *= alpha[1];
  }
  accumulate_pv<HD>(o, s, Vs);
}

// Shared memory: Qs (kRows rows), then two stages of Ks, Vs (kKeys rows each): tile i + 1's copies
// (cp.async) run while tile i's products do.
template <int HD>
__global__ void __launch_bounds__(kThreads) attn_fwd_mma(bf16* out, float* lse, const bf16* q, const bf16* k,
                                                         const bf16* v, AttnDims n, float scale_log2) {
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int ld = kRowStride<HD>, stage = 2 * kKeys * ld;  // a stage: Ks then Vs
  bf16 *Qs = reinterpret_cast<bf16*>(smem_raw), *KVs = Qs + kRows * ld;
  const int T = n.T, H = n.H;
  const int r0 = (gridDim.x - 1 - blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z, kvh = h / (H / n.KV);
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int64_t od = static_cast<int64_t>(H) * HD, kvd = n.kvs;  // out packed; q rows n.qs apart, k / v kvd
  const int64_t kv_off = static_cast<int64_t>(b) * T * kvd + kvh * HD;
  const bf16 *kb = k + kv_off, *vb = v + kv_off;
  const int row_a = r0 + warp * 16 + g, last_row = min(r0 + kRows, T) - 1;
  mma::load_tile_async<HD, kThreads>(Qs, q + static_cast<int64_t>(b) * T * n.qs + h * HD, n.qs, r0, kRows, T);
  mma::cp_async_commit();
  mma::load_kv_async<HD, kThreads>(KVs, kb, vb, kvd, 0, kKeys, T);
  mma::cp_async_commit();
  mma::cp_async_wait<1>();  // Q landed; tile 0 may still be on its way
  __syncthreads();
  uint32_t qf[HD / 16][4];
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) mma::load_a(qf[kk], Qs, ld, warp * 16, 16 * kk);
  float o[HD / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int c0 = 0, i = 0; c0 <= last_row; c0 += kKeys, ++i) {
    bf16* cur = KVs + (i & 1) * stage;
    if (c0 + kKeys <= last_row)  // tile i + 1 into the other stage, which every warp is done with
      mma::load_kv_async<HD, kThreads>(KVs + ((i + 1) & 1) * stage, kb, vb, kvd, c0 + kKeys, kKeys, T);
    mma::cp_async_commit();   // (empty in the last pass: wait<1> means the same in every pass)
    mma::cp_async_wait<1>();  // this thread's copies of tile i
    __syncthreads();          // everyone's
    attend_tile<HD>(o, m, l, qf, cur, cur + kKeys * ld, row_a, c0, T, scale_log2);
    __syncthreads();  // every warp is done with tile i's stage before tile i + 2's copies start
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row_a + 8 * i;
    if (row >= T) continue;
    const float inv = 1.0f / l[i];
    bf16* orow = out + (static_cast<int64_t>(b) * T + row) * od + h * HD + 2 * t;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt)
      *reinterpret_cast<uint32_t*>(orow + 8 * nt) = mma::pack(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
    if (t == 0) lse[(static_cast<int64_t>(b) * H + h) * T + row] = m[i] * mma::kLn2 + logf(l[i]);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int HD>
void launch(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const AttnDims& n,
            cudaStream_t stream) {
  static_assert(HD % 16 == 0, "q k^T runs in mma k-steps of 16 head dims");
  const size_t smem = static_cast<size_t>(kRows + 4 * kKeys) * kRowStride<HD> * sizeof(bf16);  // Q, 2 x (K, V)
  JTOK_CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_mma<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  const dim3 grid((n.T + kRows - 1) / kRows, n.H, n.B);
  const float scale_log2 = mma::kLog2e / std::sqrt(static_cast<float>(HD));
  attn_fwd_mma<HD><<<grid, kThreads, smem, stream>>>(out, lse, q, k, v, n, scale_log2);
  JTOK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_forward_mma(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const AttnDims& n,
                           int hd, cudaStream_t stream) {
  if (!aligned16(out) || !aligned16(q) || !aligned16(k) || !aligned16(v) || n.qs % 8 != 0 || n.kvs % 8 != 0)
    fail("cuda attention: bf16 q, k, v and out must be 16-byte aligned with token strides a multiple of 8 (q ", n.qs,
         ", kv ", n.kvs, ")");
  with_head_dim(hd, [&](auto d) { launch<decltype(d)::value>(out, lse, q, k, v, n, stream); });
}

}  // namespace jtok::cuda
