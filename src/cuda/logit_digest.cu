// A logit row's digest on the GPU (src/cuda/logit_digest.h): one block of kThreads a row, in passes
// over the row (it stays in L2: 16 rows of Qwen3's 151,936 logits are 9.7 MB):
//   1. max and argmax: per-thread strided scans, then a (value desc, id asc) reduction (a total
//      order: the same winner whatever the tree).
//   2. the sums, warp w over its own run of the row [w seg, (w + 1) seg), 32 ids at a time: lse's
//      exp(l - max) per lane, then a butterfly; sum_t's exp((l - max) / T) by a warp inclusive scan
//      per 32 ids added to the warp's running total; the warps' totals in warp order by one thread.
//   3. the kDigestTop-th largest logit by radix select on order-preserving keys (4 passes of 8 bits;
//      integer shared-memory counts, so deterministic), then the ids above it and, lowest ids first,
//      those equal to it, gathered in index order by block-wide ballot prefixes, and sorted by rank
//      (each entry counts the entries the comparator puts first: a total order, unique ranks).
//   4. drawn: r = u * sum_t; the first warp whose running total reaches r walks its run again with
//      the same scans, and the first id whose running value reaches r is drawn. The walk repeats
//      pass 2's additions exactly, so the warp pass 2 chose does reach r.
// Only fp32 rows: the decoder's LM head writes fp32 logits in both of its instantiations.
#include <cuda_runtime.h>

#include <climits>

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/logit_digest.h"
#include "cuda/pdl.cuh"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;
constexpr unsigned kFull = 0xffffffffu;

struct DigestShared {
  float warp_max[kWarps];
  int warp_arg[kWarps];
  double warp_lse[kWarps], warp_t[kWarps], excl_t[kWarps];
  int hist[kBins];
  int count_gt[kWarps], count_eq[kWarps];
  float list_logit[kDigestTop];
  int list_id[kDigestTop];
  float mx;
  int arg, k_rem, draw_warp;
  unsigned prefix;
  double sum_t, r;
};

// Keys whose unsigned order is the floats' order (-0 as +0: the comparator sees them equal).
__device__ __forceinline__ unsigned order_key(float x) {
  unsigned u = __float_as_uint(x);
  if ((u << 1) == 0) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ int64_t lmin(int64_t a, int64_t b) { return a < b ? a : b; }
// The list's length: every id of a row shorter than kDigestTop.
__device__ __forceinline__ int list_len(int64_t V) { return V < kDigestTop ? static_cast<int>(V) : kDigestTop; }

// (v, i) better than (w, j): larger, or equal and a lower id.
__device__ __forceinline__ bool better(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

__device__ __forceinline__ void warp_best(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, v, o);
    const int oi = __shfl_xor_sync(kFull, i, o);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
}

// Hillis-Steele inclusive scan over the 32 lanes (a fixed tree).
__device__ __forceinline__ double warp_scan(double v, int lane) {
  for (int o = 1; o < 32; o <<= 1) {
    const double n = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

// Pass 1: sh.mx, sh.arg.
__device__ void row_max(const float* l, int64_t V, DigestShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float v = -__int_as_float(0x7f800000);  // -inf
  int i = INT_MAX;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) {
    const float x = __ldg(l + j);
    if (better(x, static_cast<int>(j), v, i)) v = x, i = static_cast<int>(j);
  }
  warp_best(v, i);
  if (lane == 0) sh.warp_max[warp] = v, sh.warp_arg[warp] = i;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? sh.warp_max[lane] : -__int_as_float(0x7f800000);
    i = lane < kWarps ? sh.warp_arg[lane] : INT_MAX;
    warp_best(v, i);
    if (lane == 0) sh.mx = v, sh.arg = i;
  }
  __syncthreads();
}

// The ids of warp w's run: [w seg, min(V, (w + 1) seg)), seg a multiple of 32.
__device__ __forceinline__ int64_t run_len(int64_t V) { return ((V + 32 * kWarps - 1) / (32 * kWarps)) * 32; }

// Pass 2: each warp's lse and sum_t totals, then (thread 0) the block's and the warps' exclusive sums.
__device__ void row_sums(const float* l, int64_t V, double T, DigestShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t seg = run_len(V), begin = warp * seg, end = lmin(V, begin + seg);
  const float mx = sh.mx;
  double lse = 0, run = 0;
  for (int64_t c = begin; c < end; c += 32) {
    const int64_t j = c + lane;
    const float x = j < end ? __ldg(l + j) : mx;
    if (j < end) lse += exp(static_cast<double>(x - mx));
    if (T > 0) {
      const double s = warp_scan(j < end ? exp((static_cast<double>(x) - mx) / T) : 0.0, lane);
      run += __shfl_sync(kFull, s, 31);
    }
  }
  lse = warp_sum(lse);
  if (lane == 0) sh.warp_lse[warp] = lse, sh.warp_t[warp] = run;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0, t = 0;
    for (int w = 0; w < kWarps; ++w) {
      s += sh.warp_lse[w];
      sh.excl_t[w] = t;
      t += sh.warp_t[w];
    }
    sh.warp_lse[0] = s;
    sh.sum_t = t;
  }
  __syncthreads();
}

// Pass 3a: sh.prefix = the key of the k-th largest logit (k = min(V, kDigestTop)); sh.k_rem = how
// many logits equal to it the list takes.
__device__ void radix_select(const float* l, int64_t V, DigestShared& sh) {
  if (threadIdx.x == 0) sh.prefix = 0, sh.k_rem = list_len(V);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    const unsigned hi = shift == 24 ? 0u : (0xffffffffu << (shift + 8)), want = sh.prefix & hi;
    for (int64_t j = threadIdx.x; j < V; j += kThreads) {
      const unsigned key = order_key(__ldg(l + j));
      if ((key & hi) == want) atomicAdd(&sh.hist[(key >> shift) & 0xff], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0;
      for (int b = kBins - 1; b >= 0; --b) {
        if (above + sh.hist[b] >= sh.k_rem) {
          sh.prefix |= static_cast<unsigned>(b) << shift;
          sh.k_rem -= above;
          break;
        }
        above += sh.hist[b];
      }
    }
    __syncthreads();
  }
}

// Pass 3b: the list, unsorted: every id above the threshold key, and the k_rem lowest ids at it.
__device__ void gather_list(const float* l, int64_t V, DigestShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned thr = sh.prefix, below = (1u << lane) - 1u;
  const int k_rem = sh.k_rem, n_gt = list_len(V) - k_rem;
  int base_gt = 0, base_eq = 0;  // the same in every thread: sums of the shared counts
  for (int64_t c = 0; c < V && (base_gt < n_gt || base_eq < k_rem); c += kThreads) {
    const int64_t j = c + threadIdx.x;
    const float x = j < V ? __ldg(l + j) : 0.f;
    const unsigned key = order_key(x);
    const bool gt = j < V && key > thr, eq = j < V && key == thr;
    const unsigned bg = __ballot_sync(kFull, gt), be = __ballot_sync(kFull, eq);
    if (lane == 0) sh.count_gt[warp] = __popc(bg), sh.count_eq[warp] = __popc(be);
    __syncthreads();
    int at_gt = base_gt + __popc(bg & below), at_eq = base_eq + __popc(be & below);
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) at_gt += sh.count_gt[w], at_eq += sh.count_eq[w];
      base_gt += sh.count_gt[w];
      base_eq += sh.count_eq[w];
    }
    if (gt) sh.list_logit[at_gt] = x, sh.list_id[at_gt] = static_cast<int>(j);
    if (eq && at_eq < k_rem) sh.list_logit[n_gt + at_eq] = x, sh.list_id[n_gt + at_eq] = static_cast<int>(j);
    __syncthreads();  // the counts are rewritten by the next chunk
  }
}

// Pass 4 (T > 0): warp draw_warp walks its run again; the first id whose running value reaches r.
__device__ void walk_draw(const float* l, int64_t V, double T, DigestShared& sh, LogitDigest* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (warp != sh.draw_warp) return;
  const int64_t seg = run_len(V), begin = warp * seg, end = lmin(V, begin + seg);
  const double excl = sh.excl_t[warp], r = sh.r, mx = sh.mx;
  double run = 0;
  for (int64_t c = begin; c < end; c += 32) {
    const int64_t j = c + lane;
    const double s = warp_scan(j < end ? exp((static_cast<double>(__ldg(l + j)) - mx) / T) : 0.0, lane);
    const unsigned hit = __ballot_sync(kFull, excl + (run + s) >= r);
    if (hit) {
      // A padding lane's value can round past the last real one's: the run's last id then.
      const int64_t i = lmin(c + __ffs(hit) - 1, end - 1);
      if (lane == 0) out->drawn = static_cast<int32_t>(i), out->drawn_logit = __ldg(l + i);
      return;
    }
    run += __shfl_sync(kFull, s, 31);
  }
  if (lane == 0) out->drawn = static_cast<int32_t>(end - 1), out->drawn_logit = __ldg(l + end - 1);  // unreachable
}

// The list sorted by the comparator, and the scalars.
__device__ void write_digest(int64_t V, double T, DigestShared& sh, LogitDigest* out) {
  const int n = list_len(V);
  const int t = threadIdx.x;
  if (t < n) {
    const float x = sh.list_logit[t];
    const int id = sh.list_id[t];
    int rank = 0;
    for (int k = 0; k < n; ++k) rank += better(sh.list_logit[k], sh.list_id[k], x, id);
    out->top_id[rank] = id;
    out->top_logit[rank] = x;
  } else if (t < kDigestTop) {  // a row shorter than the list: the rest defined, never read
    out->top_id[t] = -1;
    out->top_logit[t] = 0.f;
  }
  if (t == 0) {
    out->argmax = sh.arg;
    out->max = sh.mx;
    out->lse = static_cast<double>(sh.mx) + log(sh.warp_lse[0]);
    out->sum_t = T > 0 ? sh.sum_t : 0.0;
    out->n_top = n;
    if (T <= 0) out->drawn = -1, out->drawn_logit = 0.f;
  }
}

__global__ void __launch_bounds__(kThreads) logit_digest_kernel(LogitDigest* out, const float* logits, int64_t V,
                                                                 int64_t ld, const DigestRow* rows) {
  pdl_wait();
  __shared__ DigestShared sh;
  const float* l = logits + blockIdx.x * ld;
  LogitDigest* o = out + blockIdx.x;
  const double T = rows[blockIdx.x].temperature;
  row_max(l, V, sh);
  row_sums(l, V, T, sh);
  if (threadIdx.x == 0 && T > 0) {  // uniform_real_distribution's r = u (sum - 0) + 0, and its warp
    sh.r = rows[blockIdx.x].u * (sh.sum_t - 0.0) + 0.0;
    int w = 0;
    while (w + 1 < kWarps && !(sh.excl_t[w] + sh.warp_t[w] >= sh.r)) ++w;
    sh.draw_warp = w;
  }
  radix_select(l, V, sh);  // its first barrier publishes r and draw_warp
  gather_list(l, V, sh);
  __syncthreads();
  write_digest(V, T, sh, o);
  if (T > 0) walk_draw(l, V, T, sh, o);
}

}  // namespace

void logit_digest(LogitDigest* out, const float* logits, int64_t M, int64_t V, int64_t ld, const DigestRow* rows,
                  CUstream_st* stream) {
  JTOK_CHECK(V > 0 && ld >= V && V <= INT_MAX, "logit_digest: rows of ", V, " logits at stride ", ld);
  if (M <= 0) return;
  logit_digest_kernel<<<static_cast<unsigned>(M), kThreads, 0, stream>>>(out, logits, V, ld, rows);
  JTOK_CUDA_CHECK_LAUNCH();
}

}  // namespace jtok::cuda
