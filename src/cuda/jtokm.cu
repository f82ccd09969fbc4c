// JTok-M (src/cuda/jtokm.h). Routing: one thread a position (n_e and K are small); its statistics:
// a block a table over every position, double sums in a fixed tree, then the aux loss. Mix + norm +
// inject: one block a position. dL/de, then dw and dL/dg: a block a range of positions, 4 at a time
// (e mixed again from the rows, never stored), ds per column in shared memory, then the blocks'
// partials in block order. Table gradients: one block a
// unique id, its rows of a group of tables in shared memory, positions in order (without dedup: a
// block a position, fp32 atomics). The tables an id chose: ORs (a thread a position, or the id's
// block together), never one thread walking a frequent id's positions. T (float or __nv_bfloat16) is converted to fp32
// on every load and rounded once on every store.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/hot_ids.cuh"
#include "cuda/jtokm.h"
#include "cuda/pdl.cuh"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kStatsThreads = 1024;  // jtokm_route_stats_kernel's block
constexpr int64_t kMaxDeBlocks = 512;
constexpr int kDeRows = 4;    // rows jtokm_backward_de_kernel sums at once
constexpr int kDwTables = 4;  // the selections whose dw one pair of barriers sums (more: in turns)

// The tables position n selected, bit i: table i (n_e <= 32).
__device__ __forceinline__ uint32_t position_tables(const int32_t* sel, int64_t n, int64_t K) {
  uint32_t bits = 0;
  for (int64_t k = 0; k < K; ++k) bits |= 1u << sel[n * K + k];
  return bits;
}

// Position n's routing from its logits (n_e): sig, the top K and their weights (one thread).
__device__ void route_position(float* sig, int32_t* sel, float* w, const float* logits, int64_t n, int ne, int K) {
  const float* g = logits + n * ne;
  float* sg = sig + n * ne;
  for (int i = 0; i < ne; ++i) sg[i] = 1.0f / (1.0f + expf(-g[i]));
  int32_t* s = sel + n * K;
  for (int j = 0; j < K; ++j) {  // top_k_lower_index: the first maximum among the unchosen
    int best = -1;
    for (int e = 0; e < ne; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= s[i] == e;
      if (!taken && (best < 0 || g[e] > g[best])) best = e;
    }
    s[j] = best;
  }
  float sum = 0.0f;
  for (int k = 0; k < K; ++k) sum += sg[s[k]];
  for (int k = 0; k < K; ++k) w[n * K + k] = sg[s[k]] / sum;
}

// Thread n: position n's routing; with chosen, its tables ORed into chosen[inverse[n]] (zeroed first).
__global__ void __launch_bounds__(kThreads)
    jtokm_route_kernel(float* sig, int32_t* sel, float* w, const float* logits, int64_t N, int ne, int K,
                       uint32_t* chosen, const int32_t* __restrict__ inverse) {
  pdl_wait();
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  route_position(sig, sel, w, logits, n, ne, K);
  if (chosen) atomicOr(chosen + inverse[n], position_tables(sel, n, K));
}

// Block i: table i's prob_sum (the positions' sig_i / sum of sig), load (positions selecting it) and
// weight_sum (their weights, where set), each thread a strided share of the positions summed in
// double, then one fixed tree over the block. Every table at once, so no block waits on another.
__global__ void __launch_bounds__(kStatsThreads)
    jtokm_route_stats_kernel(JTokMDeviceActs acts, int64_t N, int ne, int K) {
  pdl_wait();
  __shared__ double red[3 * 32];
  const int i = static_cast<int>(blockIdx.x);
  double sums[3] = {};  // p, l, w
  double &p = sums[0], &l = sums[1], &w = sums[2];
  for (int64_t n = threadIdx.x; n < N; n += kStatsThreads) {
    const float* sg = acts.sig + n * ne;
    double all = 0.0;
    for (int t = 0; t < ne; ++t) all += sg[t];
    p += sg[i] / all;
    for (int k = 0; k < K; ++k)
      if (acts.sel[n * K + k] == i) l += 1.0, w += acts.w[n * K + k];
  }
  block_sums(sums, red);
  if (threadIdx.x != 0) return;
  acts.prob_sum[i] = p, acts.load[i] = static_cast<int32_t>(l);
  if (acts.weight_sum) acts.weight_sum[i] = w;
}

// What the kernels read of position n to mix e: its K selections, weights and id.
struct MixRow {
  const int32_t* sel;
  const float* w;
  int64_t id;
};

__device__ __forceinline__ MixRow mix_row(const JTokMDeviceActs& acts, const int32_t* ids, int64_t n, int64_t K) {
  return {acts.sel + n * K, acts.w + n * K, ids[n]};
}

// Element j of the row its k-th selection chose, E_{sel_k}[id][j].
template <typename T>
__device__ __forceinline__ float chosen_element(const T* E, const MixRow& r, int64_t k, const JTokMDims& dm,
                                                int64_t j) {
  return to_f32(E[(r.sel[k] * dm.V + r.id) * dm.d + j]);
}

// e's element j: sum_k w_k E_{sel_k}[id][j], k in order from 0, each product rounded before its add
// (no fused multiply-add: the CPU's order of fp32 operations, and one set of bits however the
// compiler treats the code around it: the backward mixes e again and must get the forward's).
template <typename T>
__device__ __forceinline__ float mix_element(const T* E, const MixRow& r, const JTokMDims& dm, int64_t j) {
  float v = 0.0f;
  for (int64_t k = 0; k < dm.K; ++k) v = __fadd_rn(v, __fmul_rn(r.w[k], chosen_element(E, r, k, dm, j)));
  return v;
}

// Block n: e (d) = sum_k w_k E_{sel_k}[ids[n]], its norm, h_next += c inv s e (e mixed again: the rows
// are in L1); with route_logits, position n routed first by thread 0 (jtokm_route's arithmetic).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    jtokm_mix_inject_kernel(T* h_next, JTokMDeviceActs acts, const int32_t* ids, const T* E, const T* s, JTokMDims dm,
                            const float* route_logits) {
  pdl_wait();
  __shared__ float red[32];
  const int64_t n = blockIdx.x, d = dm.d;
  if (route_logits) {  // its sel and w in global memory, seen by the block after the barrier
    if (threadIdx.x == 0)
      route_position(acts.sig, acts.sel, acts.w, route_logits, n, static_cast<int>(dm.n_e), static_cast<int>(dm.K));
    __syncthreads();
  }
  const MixRow r = mix_row(acts, ids, n, dm.K);
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = mix_element(E, r, dm, j);
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float inv = dm.norm ? 1.0f / (sqrtf(ss) + dm.eps) : 1.0f;
  if (threadIdx.x == 0) acts.inv_norm[n] = inv;
  const float ci = dm.c * inv;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    h_next[n * d + j] = from_f32<T>(to_f32(h_next[n * d + j]) + ci * to_f32(s[j]) * mix_element(E, r, dm, j));
}

// dg (n_e) of position n from its dw (K): through the mixing weights, then the sigmoids, with the aux
// loss's dp; one thread's arithmetic (fp32, the aux terms in double).
template <typename T>
__device__ void router_grad(T* dg, const JTokMDeviceActs& acts, const float* dw, float aux_grad, const JTokMDims& dm,
                            int64_t n) {
  const int ne = static_cast<int>(dm.n_e), K = static_cast<int>(dm.K);
  const int32_t* sel = acts.sel + n * K;
  const float* wk = acts.w + n * K;
  const float* sg = acts.sig + n * ne;
  float ssel = 0.0f, wdw = 0.0f, sall = 0.0f, pdp = 0.0f;
  float dp[kJTokMMaxTables], dsig[kJTokMMaxTables];
  for (int i = 0; i < ne; ++i)  // dL/dp_t^(i) of the aux loss: the same for every position
    dp[i] = static_cast<float>(aux_grad * dm.lambda * static_cast<double>(ne) * acts.load[i] /
                               (static_cast<double>(dm.N) * dm.N * K));
  for (int k = 0; k < K; ++k) ssel += sg[sel[k]], wdw += wk[k] * dw[k];
  for (int i = 0; i < ne; ++i) sall += sg[i];
  for (int i = 0; i < ne; ++i) pdp += sg[i] / sall * dp[i];
  for (int i = 0; i < ne; ++i) dsig[i] = (dp[i] - pdp) / sall;
  for (int k = 0; k < K; ++k) dsig[sel[k]] += (dw[k] - wdw) / ssel;
  for (int i = 0; i < ne; ++i) dg[n * ne + i] = from_f32<T>(dsig[i] * sg[i] * (1.0f - sg[i]));
}

// dw of the kDeRows rows from n0 (live of them) and selections [k0, k0 + kDwTables): de . E_{sel_k}[x]
// per thread over its columns (the ones it wrote de of), then block sums; thread 0 keeps them in dw.
template <typename T>
__device__ void dw_sums(float (*dw)[kJTokMMaxTables], float* red, const float* de, const T* E, const MixRow* rows,
                        int live, int64_t n0, int64_t k0, const JTokMDims& dm) {
  const int64_t d = dm.d, kn = min(static_cast<int64_t>(kDwTables), dm.K - k0);
  float part[kDeRows * kDwTables] = {};
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
#pragma unroll
    for (int r = 0; r < kDeRows; ++r) {
      if (r >= live) break;
      const float g = de[(n0 + r) * d + j];
#pragma unroll
      for (int t = 0; t < kDwTables; ++t)
        if (t < kn) part[r * kDwTables + t] += g * chosen_element(E, rows[r], k0 + t, dm, j);
    }
  block_sums(part, red);
  if (threadIdx.x == 0)
    for (int r = 0; r < live; ++r)
      for (int64_t t = 0; t < kn; ++t) dw[r][k0 + t] = part[r * kDwTables + t];
}

// Rows [b*rows, (b+1)*rows), kDeRows at a time (their loads in flight together, one pair of barriers
// for their sums: a row's bits are those of one row at a time): e mixed again from the rows, de, the
// block's ds partial (d) into ds_part (per column added row after row), then each row's dw_k = de .
// E_{sel_k}[x] and from them dg (a thread a row). Shared: d floats of ds.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    jtokm_backward_de_kernel(float* de, float* ds_part, T* dg, JTokMDeviceActs acts, const T* dh, const T* s,
                             const int32_t* ids, const T* E, float aux_grad, JTokMDims dm, int64_t rows) {
  pdl_wait();
  extern __shared__ float dsp[];
  __shared__ float red[32 * kDeRows * kDwTables];
  __shared__ float dw[kDeRows][kJTokMMaxTables];
  const int64_t d = dm.d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dsp[j] = 0.0f;
  const int64_t lo = blockIdx.x * rows, hi = min(dm.N, lo + rows);
  for (int64_t n0 = lo; n0 < hi; n0 += kDeRows) {
    const int live = static_cast<int>(min(static_cast<int64_t>(kDeRows), hi - n0));  // rows past hi: none
    MixRow mr[kDeRows];
#pragma unroll
    for (int k = 0; k < kDeRows; ++k) mr[k] = mix_row(acts, ids, n0 + min(k, live - 1), dm.K);
    float sums[2 * kDeRows] = {};  // row k's e . dn at 2k, ||e||^2 at 2k + 1
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float gj[kDeRows], ej[kDeRows];  // every row's loads issued before any store
#pragma unroll
      for (int k = 0; k < kDeRows; ++k)
        gj[k] = to_f32(dh[(n0 + min(k, live - 1)) * d + j]), ej[k] = mix_element(E, mr[k], dm, j);
      const float sj = to_f32(s[j]);
#pragma unroll
      for (int k = 0; k < kDeRows; ++k) {
        if (k >= live) break;
        const int64_t n = n0 + k;
        dsp[j] += dm.c * acts.inv_norm[n] * gj[k] * ej[k];  // column j is this thread's alone, rows in order
        const float dn = dm.c * sj * gj[k];                 // dL/dNorm(e)
        de[n * d + j] = dn;
        sums[2 * k] += ej[k] * dn;
        sums[2 * k + 1] += ej[k] * ej[k];
      }
    }
    block_sums(sums, red);
#pragma unroll
    for (int k = 0; k < kDeRows; ++k) {
      if (!dm.norm || k >= live) break;
      // Through Norm: de = dn / (r + eps) - e (e . dn) / (r (r + eps)^2).
      const int64_t n = n0 + k;
      float* dn = de + n * d;
      const float inv = acts.inv_norm[n], r = sqrtf(sums[2 * k + 1]);
      const float cf = r > 0.0f ? sums[2 * k] * inv * inv / r : 0.0f;
      for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dn[j] = dn[j] * inv - mix_element(E, mr[k], dm, j) * cf;
    }
    for (int64_t k0 = 0; k0 < dm.K; k0 += kDwTables) dw_sums(dw, red, de, E, mr, live, n0, k0, dm);
    __syncthreads();  // thread 0's dw to the row threads
    if (static_cast<int>(threadIdx.x) < live) router_grad(dg, acts, dw[threadIdx.x], aux_grad, dm, n0 + threadIdx.x);
  }
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ds_part[blockIdx.x * d + j] = dsp[j];
}

__global__ void __launch_bounds__(kThreads)
    jtokm_sum_blocks_kernel(float* ds, const float* ds_part, int64_t blocks, int64_t d) {
  pdl_wait();
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  ds[j] += strided_sum_in_order(ds_part + j, blocks, d);  // 32 loads in flight, summed in order
}

// The tables positions order[lo .. hi) chose, ORed by the whole block (a frequent id has thousands of
// positions); the same in every thread.
__device__ uint32_t block_tables_chosen(const int32_t* sel, const int32_t* order, int lo, int hi, int64_t K) {
  __shared__ uint32_t chosen;
  if (threadIdx.x == 0) chosen = 0;
  __syncthreads();
  uint32_t mine = 0;
  for (int p = lo + static_cast<int>(threadIdx.x); p < hi; p += static_cast<int>(blockDim.x))
    mine |= position_tables(sel, order[p], K);
  if (mine != 0) atomicOr(&chosen, mine);
  __syncthreads();
  return chosen;
}

// rows (g1 - g0, d) in shared memory += for the count staged positions pos, in order (k in order
// within one), w_k * de where table sel_k lies in [g0, g1). Column j is thread j % blockDim.x's.
__device__ void add_positions(float* rows, const JTokMDeviceActs& acts, const float* __restrict__ de,
                              const int32_t* pos, int count, int64_t g0, int64_t g1, int64_t K, int64_t d) {
  for (int t = 0; t < count; ++t) {
    const int64_t n = pos[t];
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = acts.sel[n * K + k];
      if (i < g0 || i >= g1) continue;
      const float wk = acts.w[n * K + k];
      for (int64_t j = threadIdx.x; j < d; j += blockDim.x) rows[(i - g0) * d + j] += wk * de[n * d + j];
    }
  }
}

// Block q: piece q of the batch's hot ids (hot_ids.cuh) -> hot rows (q, n_e, d): table i's row the sum
// over the piece's positions, from zero in position order, of w * de where they chose i (zero where none did).
__global__ void __launch_bounds__(kThreads)
    jtokm_hot_kernel(float* hot, JTokMDeviceActs acts, const float* __restrict__ de, DeviceRowBatch rb, JTokMDims dm,
                     int64_t group) {
  pdl_wait();
  extern __shared__ float rows[];  // (group, d)
  __shared__ int32_t pos[kHotChunk];
  const PositionRange r = hot_piece(rb, dm.N, blockIdx.x);
  if (r.size() == 0) return;
  stage_positions(pos, rb.order, r);
  const int64_t d = dm.d;
  for (int64_t g0 = 0; g0 < dm.n_e; g0 += group) {
    const int64_t g1 = min(dm.n_e, g0 + group);
    for (int64_t i = 0; i < g1 - g0; ++i)
      for (int64_t j = threadIdx.x; j < d; j += blockDim.x) rows[i * d + j] = 0.0f;
    add_positions(rows, acts, de, pos, r.size(), g0, g1, dm.K, d);
    for (int64_t i = 0; i < g1 - g0; ++i)
      for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        hot[(blockIdx.x * dm.n_e + g0 + i) * d + j] = rows[i * d + j];
  }
}

// Hot entry u (positions [lo, hi)): row (i, id) of each table i in used = (where accumulate's bit i
// is set: its values, else zero) + its pieces' rows (jtokm_hot_kernel's), in chunk order; flagged.
__device__ void add_hot_pieces(float* gE, uint8_t* touched, const float* __restrict__ hot, uint32_t used,
                               uint32_t accumulate, int64_t id, int lo, int hi, const JTokMDims& dm) {
  for (int64_t i = 0; i < dm.n_e; ++i) {
    if (!(used >> i & 1u)) continue;
    float* row = gE + (i * dm.V + id) * dm.d;
    for (int64_t j = threadIdx.x; j < dm.d; j += blockDim.x)  // piece q's rows at hot + q (n_e, d)
      row[j] = add_hot_pieces_in_order(accumulate >> i & 1u ? row[j] : 0.0f, hot + i * dm.d + j, lo, hi, dm.n_e * dm.d);
    if (threadIdx.x == 0) touched[i * dm.V + id] = 1;
  }
}

// Block u < U: row (i, unique[u]) of every table i some position of u selected += w * de over those
// positions, in position order (k in order within one): the fp32 adds of one element in the same
// order as a loop per element, from the row's values where it is flagged touched, else from zero; a
// hot id's from its pieces' sums (add_hot_pieces). The tables go in groups of `group` whose rows sit
// in shared memory (column j owned by thread j % blockDim.x: no barrier), so a position's K
// selections are read once a group for all its columns, not once a column and table. An identity
// batch (rb.distinct false: a block a position, rows repeating) sums from zero and adds its sums into
// gE by fp32 atomics, in no fixed order: the naive scatter, not bitwise reproducible.
__global__ void __launch_bounds__(kThreads)
    jtokm_backward_tables_kernel(float* gE, uint8_t* touched, JTokMDeviceActs acts, const float* __restrict__ de,
                                 const float* __restrict__ hot, DeviceRowBatch rb, JTokMDims dm, int64_t group) {
  pdl_wait();
  extern __shared__ float rows[];  // (group, d)
  __shared__ int32_t pos[kHotChunk];
  const int u = blockIdx.x;
  if (u >= *rb.num_unique) return;
  const int64_t id = rb.unique[u], d = dm.d;
  const int lo = rb.offsets[u], hi = rb.offsets[u + 1];
  const uint32_t used = block_tables_chosen(acts.sel, rb.order, lo, hi, dm.K);
  // bit i: row (i, id) already has a gradient this step (an earlier micro-batch's), so it is added to;
  // a row not flagged holds stale values and starts from zero. Every thread reads the flags before
  // thread 0 sets any (the barrier).
  uint32_t accumulate = 0;
  for (int64_t i = 0; rb.distinct && i < dm.n_e; ++i)
    if (used >> i & 1u && touched[i * dm.V + id]) accumulate |= 1u << i;
  __syncthreads();
  if (is_hot(lo, hi)) return add_hot_pieces(gE, touched, hot, used, accumulate, id, lo, hi, dm);
  stage_positions(pos, rb.order, PositionRange{lo, hi});
  for (int64_t g0 = 0; g0 < dm.n_e; g0 += group) {
    const int64_t g1 = min(dm.n_e, g0 + group);
    for (int64_t i = g0; i < g1; ++i)
      if (used >> i & 1u)
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
          rows[(i - g0) * d + j] = accumulate >> i & 1u ? gE[(i * dm.V + id) * d + j] : 0.0f;
    add_positions(rows, acts, de, pos, hi - lo, g0, g1, dm.K, d);
    for (int64_t i = g0; i < g1; ++i) {
      if (!(used >> i & 1u)) continue;
      float* row = gE + (i * dm.V + id) * d;
      for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        if (rb.distinct) row[j] = rows[(i - g0) * d + j];
        else atomicAdd(row + j, rows[(i - g0) * d + j]);  // other blocks may hold this row too
      }
      if (threadIdx.x == 0) touched[i * dm.V + id] = 1;  // idempotent: every writer stores the same 1
    }
  }
}

int64_t de_blocks(int64_t N) { return N < kMaxDeBlocks ? N : kMaxDeBlocks; }

// The routing's shape: 1 <= K <= n_e <= kJTokMMaxTables (the per-position kernels' bound).
void check_routing(const JTokMDims& dm, const char* who) {
  JTOK_CHECK(dm.n_e >= 1 && dm.n_e <= kJTokMMaxTables && dm.K >= 1 && dm.K <= dm.n_e, who, ": n_e ", dm.n_e, ", K ",
             dm.K, " (n_e at most ", kJTokMMaxTables, ")");
}

}  // namespace

void jtokm_route(const JTokMDeviceActs& acts, const float* logits, const JTokMDims& dm, cudaStream_t stream,
                 const ChosenTables& chosen) {
  check_routing(dm, "jtokm_route");
  if (dm.N == 0) return;
  if (chosen.bits)
    JTOK_CUDA_CHECK(
        cudaMemsetAsync(chosen.bits, 0, static_cast<size_t>(entry_blocks(chosen.rb, dm.N)) * sizeof(uint32_t), stream));
  jtokm_route_kernel<<<ceil_div(dm.N, kThreads), kThreads, 0, stream>>>(
      acts.sig, acts.sel, acts.w, logits, dm.N, static_cast<int>(dm.n_e), static_cast<int>(dm.K), chosen.bits,
      chosen.rb.inverse);
  JTOK_CUDA_CHECK_LAUNCH();
}

void jtokm_route_stats(const JTokMDeviceActs& acts, const JTokMDims& dm, cudaStream_t stream) {
  if (dm.N == 0) return;
  jtokm_route_stats_kernel<<<static_cast<int>(dm.n_e), kStatsThreads, 0, stream>>>(acts, dm.N, static_cast<int>(dm.n_e),
                                                                                   static_cast<int>(dm.K));
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename T>
void jtokm_mix_inject(T* h_next, const JTokMDeviceActs& acts, const int32_t* ids, const T* E, const T* s,
                      const JTokMDims& dm, cudaStream_t stream, const float* route_logits) {
  if (dm.N == 0) return;
  if (route_logits) check_routing(dm, "jtokm_mix_inject");
  jtokm_mix_inject_kernel<<<static_cast<int>(dm.N), kThreads, 0, stream>>>(h_next, acts, ids, E, s, dm, route_logits);
  JTOK_CUDA_CHECK_LAUNCH();
}

int64_t jtokm_backward_de_scratch(const JTokMDims& dm) { return de_blocks(dm.N) * dm.d; }

template <typename T>
void jtokm_backward_de(float* de, float* ds, T* dg, float* scratch, const JTokMDeviceActs& acts, const T* dh,
                       const T* s, const int32_t* ids, const T* E, float aux_grad, const JTokMDims& dm,
                       cudaStream_t stream) {
  check_routing(dm, "jtokm_backward_de");
  if (dm.N == 0) return;
  const int64_t blocks = de_blocks(dm.N), rows = (dm.N + blocks - 1) / blocks;
  const size_t shared = static_cast<size_t>(dm.d) * sizeof(float);
  // 48 KB of shared memory a block without opting in, the kernel's 2.5 KB of static arrays beside ds.
  JTOK_CHECK(shared <= 45 * 1024, "jtokm_backward_de: d = ", dm.d, " exceeds the 11520 columns of its shared ds");
  jtokm_backward_de_kernel<<<static_cast<int>(blocks), kThreads, shared, stream>>>(de, scratch, dg, acts, dh, s, ids, E,
                                                                                   aux_grad, dm, rows);
  JTOK_CUDA_CHECK_LAUNCH();
  jtokm_sum_blocks_kernel<<<ceil_div(dm.d, kThreads), kThreads, 0, stream>>>(ds, scratch, blocks, dm.d);
  JTOK_CUDA_CHECK_LAUNCH();
}

// Table groups whose rows fit the 48 KB of shared memory a block has without opting in, beside the
// kernels' 1 KB of static shared memory.
int64_t table_group(const JTokMDims& dm) {
  constexpr int64_t kSharedBytes = 47 * 1024;
  const int64_t group = std::min<int64_t>(dm.n_e, kSharedBytes / (dm.d * static_cast<int64_t>(sizeof(float))));
  JTOK_CHECK(group >= 1, "jtokm_backward_tables: d = ", dm.d, " exceeds the ", kSharedBytes / 4,
             " columns of its shared rows");
  return group;
}

int64_t jtokm_backward_tables_scratch(const JTokMDims& dm) { return hot_scratch_floats(dm.N, dm.n_e * dm.d); }

void jtokm_backward_tables(float* gE, uint8_t* touched, const JTokMDeviceActs& acts, const float* de,
                           const DeviceRowBatch& rb, const JTokMDims& dm, float* hot, cudaStream_t stream) {
  JTOK_CHECK(dm.n_e >= 1 && dm.n_e <= kJTokMMaxTables, "jtokm_backward_tables: n_e ", dm.n_e, " (at most ",
             kJTokMMaxTables, ")");
  if (dm.N == 0) return;
  const int64_t group = table_group(dm);
  const size_t shared = static_cast<size_t>(group * dm.d) * sizeof(float);
  jtokm_hot_kernel<<<static_cast<int>(2 * hot_chunks(dm.N)), kThreads, shared, stream>>>(hot, acts, de, rb, dm, group);
  JTOK_CUDA_CHECK_LAUNCH();
  jtokm_backward_tables_kernel<<<static_cast<int>(entry_blocks(rb, dm.N)), kThreads, shared, stream>>>(
      gE, touched, acts, de, hot, rb, dm, group);
  JTOK_CUDA_CHECK_LAUNCH();
}

#define JTOK_JTOKM_INSTANTIATE(T)                                                                                     \
  template void jtokm_mix_inject<T>(T*, const JTokMDeviceActs&, const int32_t*, const T*, const T*, const JTokMDims&, \
                                    cudaStream_t, const float*);                                                      \
  template void jtokm_backward_de<T>(float*, float*, T*, float*, const JTokMDeviceActs&, const T*, const T*,          \
                                     const int32_t*, const T*, float, const JTokMDims&, cudaStream_t);
JTOK_JTOKM_INSTANTIATE(float)
JTOK_JTOKM_INSTANTIATE(__nv_bfloat16)
#undef JTOK_JTOKM_INSTANTIATE

}  // namespace jtok::cuda
