// The bf16 attention forward on the tensor cores (FlashAttention-2's algorithm).
//   q (B,T,H,hd), k, v (B,T,KV,hd), out (B,T,H,hd) bf16; lse (B,H,T) fp32.
// One block of kWarps warps per (tile of kRows query rows, head, batch); each warp owns 16 query
// rows (or 32: attention_forward_wide, MT 2 below) and keeps their q, scores, running max / sum and
// output in registers, as the fragments of mma.sync.m16n8k16 (bf16 x bf16, fp32 accumulate). K and
// V tiles of kKeys keys are staged in shared memory (rows padded by 8 elements: the fragment loads
// fall in distinct banks), two stages: the next tile's cp.async copies run under this tile's
// products. The tiles left of the diagonal skip the causal test (softmax_fragments<false>).
// The tiles' extent over rows and keys does not depend on hd (32, 64 or 128): hd 32 only holds half
// the q and output fragments and less shared memory, and at short T (the MoE bench: T 128, 4 heads,
// B 16: 128 blocks) larger row tiles would leave SMs idle (T / kRows x H x B blocks). Registers
// (ptxas, sm_90a): 16 rows a warp 95 / 127 / 177 at hd 32 / 64 / 128; 32 rows 168 / 230 (hd 128:
// spills, not built).
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
constexpr int kKeys = 64;  // keys per tile
// MT m16 tiles of query rows a warp (1: 16 rows; 2: 32, FlashAttention-2's layout: each K and V
// fragment read from shared memory feeds MT products, half the shared-memory reads per product).
template <int MT>
constexpr int kRows = kWarps * 16 * MT;  // query rows per block

using mma::kRowStride;
using mma::mma_bf16;

// s[mt] (16 x kKeys, as kKeys / 8 C fragments) = the warp's m-tile mt of q rows . the tile's keys;
// each key fragment is loaded once for the MT tiles. Per tile the products run in the order of one.
template <int HD, int MT>
__device__ void score_fragments(float (&s)[MT][kKeys / 8][4], const uint32_t (&qf)[MT][HD / 16][4], const bf16* Ks) {
#pragma unroll
  for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t b0, b1;  // keys 8 nt.., head dims 16 kk..
      mma::load_b_rows_t(b0, b1, Ks, kRowStride<HD>, 8 * nt, 16 * kk);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) mma_bf16(s[mt][nt], qf[mt][kk], b0, b1);
    }
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

// The running softmax and output of a warp's MT m-tiles: tile mt's rows row_a + 16 mt and row_a + 16
// mt + 8 (row_a = the warp's first row + g).
template <int HD, int MT>
struct WarpRows {
  uint32_t qf[MT][HD / 16][4];
  float o[MT][HD / 8][4] = {};
  float m[MT][2], l[MT][2];
};

// One tile of kKeys keys from c0 (staged in Ks, Vs) onto the warp's running softmax and output.
template <int HD, int MT>
__device__ void attend_tile(WarpRows<HD, MT>& w, const bf16* Ks, const bf16* Vs, int row_a, int c0, int T,
                            float scale_log2) {
  float s[MT][kKeys / 8][4], alpha[2];
  score_fragments<HD, MT>(s, w.qf, Ks);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int rows_a = row_a + 16 * mt, tile_row0 = rows_a - (threadIdx.x % 32) / 4;  // the m-tile's first row
    if (c0 + kKeys - 1 <= tile_row0 && c0 + kKeys <= T)
      softmax_fragments<false>(s[mt], w.m[mt], w.l[mt], alpha, rows_a, c0, T, scale_log2);
    else
      softmax_fragments<true>(s[mt], w.m[mt], w.l[mt], alpha, rows_a, c0, T, scale_log2);
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
      w.o[mt][nt][0] *= alpha[0], w.o[mt][nt][1] *= alpha[0];
      w.o[mt][nt][2] *= alpha[1], w.o[mt][nt][3] *= alpha[1];
    }
  }
  mma::accumulate_tiles<HD, kKeys, MT>(w.o, s, Vs);  // o += P V
}

// The warp's rows (those below T) into out and lse.
template <int HD, int MT>
__device__ void store_rows(const WarpRows<HD, MT>& w, bf16* out, float* lse, int row_a, int b, int h, int T, int H) {
  const int t = threadIdx.x % 4;
  const int64_t od = static_cast<int64_t>(H) * HD;  // out packed
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = row_a + 16 * mt + 8 * i;
      if (row >= T) continue;
      const float inv = 1.0f / w.l[mt][i];
      bf16* orow = out + (static_cast<int64_t>(b) * T + row) * od + h * HD + 2 * t;
#pragma unroll
      for (int nt = 0; nt < HD / 8; ++nt)
        *reinterpret_cast<uint32_t*>(orow + 8 * nt) = mma::pack(w.o[mt][nt][2 * i] * inv, w.o[mt][nt][2 * i + 1] * inv);
      if (t == 0) lse[(static_cast<int64_t>(b) * H + h) * T + row] = w.m[mt][i] * mma::kLn2 + logf(w.l[mt][i]);
    }
}

// Shared memory: Qs (kRows<MT> rows), then two stages of Ks, Vs (kKeys rows each): tile i + 1's copies
// (cp.async) run while tile i's products do. A warp skips the tiles past its last row (with MT 2 the
// block's rows span two diagonal tiles): every key there is masked for it, which changes none of its
// sums.
template <int HD, int MT>
__global__ void __launch_bounds__(kThreads)
    attn_fwd_mma(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, AttnDims n, float scale_log2) {
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int ld = kRowStride<HD>, stage = 2 * kKeys * ld, rows = kRows<MT>;  // a stage: Ks then Vs
  bf16 *Qs = reinterpret_cast<bf16*>(smem_raw), *KVs = Qs + rows * ld;
  const int T = n.T, H = n.H;
  const int r0 = (gridDim.x - 1 - blockIdx.x) * rows, h = blockIdx.y, b = blockIdx.z, kvh = h / (H / n.KV);
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4;
  const int64_t kvd = n.kvs;  // q rows n.qs apart, k / v kvd
  const int64_t kv_off = static_cast<int64_t>(b) * T * kvd + kvh * HD;
  const bf16 *kb = k + kv_off, *vb = v + kv_off;
  const int warp_row0 = r0 + warp * 16 * MT, row_a = warp_row0 + g, last_row = min(r0 + rows, T) - 1;
  mma::load_tile_async<HD, kThreads>(Qs, q + static_cast<int64_t>(b) * T * n.qs + h * HD, n.qs, r0, rows, T);
  mma::cp_async_commit();
  mma::load_kv_async<HD, kThreads>(KVs, kb, vb, kvd, 0, kKeys, T);
  mma::cp_async_commit();
  mma::cp_async_wait<1>();  // Q landed; tile 0 may still be on its way
  __syncthreads();
  WarpRows<HD, MT> w;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    w.m[mt][0] = w.m[mt][1] = -INFINITY, w.l[mt][0] = w.l[mt][1] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) mma::load_a(w.qf[mt][kk], Qs, ld, warp * 16 * MT + 16 * mt, 16 * kk);
  }
  for (int c0 = 0, i = 0; c0 <= last_row; c0 += kKeys, ++i) {
    bf16* cur = KVs + (i & 1) * stage;
    if (c0 + kKeys <= last_row)  // tile i + 1 into the other stage, which every warp is done with
      mma::load_kv_async<HD, kThreads>(KVs + ((i + 1) & 1) * stage, kb, vb, kvd, c0 + kKeys, kKeys, T);
    mma::cp_async_commit();   // (empty in the last pass: wait<1> means the same in every pass)
    mma::cp_async_wait<1>();  // this thread's copies of tile i
    __syncthreads();          // everyone's
    // (MT 1: kRows = kKeys, no tile passes a warp's rows; the test left out keeps hd 128 at 177 registers, not 195.)
    if (MT == 1 || c0 <= warp_row0 + 16 * MT - 1)
      attend_tile<HD, MT>(w, cur, cur + kKeys * ld, row_a, c0, T, scale_log2);
    __syncthreads();  // every warp is done with tile i's stage before tile i + 2's copies start
  }
  store_rows<HD, MT>(w, out, lse, row_a, b, h, T, H);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int HD, int MT>
void launch(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const AttnDims& n,
            cudaStream_t stream) {
  static_assert(HD % 16 == 0, "q k^T runs in mma k-steps of 16 head dims");
  const size_t smem = static_cast<size_t>(kRows<MT> + 4 * kKeys) * kRowStride<HD> * sizeof(bf16);  // Q, 2 x (K, V)
  JTOK_CUDA_CHECK(
      cudaFuncSetAttribute(attn_fwd_mma<HD, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid((n.T + kRows<MT> - 1) / kRows<MT>, n.H, n.B);
  const float scale_log2 = mma::kLog2e / std::sqrt(static_cast<float>(HD));
  attn_fwd_mma<HD, MT><<<grid, kThreads, smem, stream>>>(out, lse, q, k, v, n, scale_log2);
  JTOK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_forward_mma(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const AttnDims& n,
                           int hd, cudaStream_t stream, int rows_per_warp) {
  if (!aligned16(out) || !aligned16(q) || !aligned16(k) || !aligned16(v) || n.qs % 8 != 0 || n.kvs % 8 != 0)
    fail("cuda attention: bf16 q, k, v and out must be 16-byte aligned with token strides a multiple of 8 (q ", n.qs,
         ", kv ", n.kvs, ")");
  with_head_dim(hd, [&](auto d) {
    constexpr int HD = decltype(d)::value;
    with_m_tiles<HD>(rows_per_warp, "cuda attention",
                     [&](auto mt) { launch<HD, decltype(mt)::value>(out, lse, q, k, v, n, stream); });
  });
}

}  // namespace jtok::cuda
