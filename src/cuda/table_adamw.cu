// The deferred table AdamW (src/cuda/table_adamw.h), mirroring src/train/table_optimizer.cpp: one
// block a listed row (grid-stride), each thread its columns through every replayed step in registers.
#include "cuda/adamw_element.cuh"
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/pdl.cuh"
#include "cuda/table_adamw.h"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxBlocks = 2048;

// Row r from the step it has to `to` by the zero-gradient steps between (replay_steps): a cold row
// (all moments zero) by p *= decay a step, a warm one by the full update without a gradient.
// Returns nothing; counts into stats. Called by the whole block.
__device__ void replay_row(const DeviceTable& t, int64_t r, int64_t to, const KeptConsts& kept, TableStats stats) {
  const int64_t have = t.row_step[r];
  if (have >= to || kept.current == kept.base) return;  // current, or nothing deferred
  if (have < kept.base || to > kept.current) {  // outside the kept steps: a bug; reported, row left as is
    if (threadIdx.x == 0 && stats.counters) atomicAdd(stats.counters + 4, 1ull);
    return;
  }
  float* p = t.p + r * t.d;
  float* m = t.m + r * t.d;
  float* v = t.v + r * t.d;
  int zero = 1;
  for (int64_t j = threadIdx.x; j < t.d; j += blockDim.x) zero &= m[j] == 0.0f && v[j] == 0.0f;
  const bool cold = __syncthreads_and(zero);
  const AdamWConsts* c = kept.consts - kept.base - 1;  // c[s]: step s
  for (int64_t j = threadIdx.x; j < t.d; j += blockDim.x) {
    float pj = p[j];
    if (cold) {  // the moments stay zero: neither read again nor written (a checkpoint's sync of every row)
      for (int64_t s = have + 1; s <= to; ++s) pj = __fmul_rn(pj, c[s].decay);
    } else {
      float mj = m[j], vj = v[j];
      for (int64_t s = have + 1; s <= to; ++s) adamw_element(pj, mj, vj, 0.0f, false, 1.0f, c[s]);
      m[j] = mj;
      v[j] = vj;
    }
    p[j] = pj;
    if (t.p_bf16) t.p_bf16[r * t.d + j] = __float2bfloat16_rn(pj);
  }
  __syncthreads();  // every thread has read row_step before it moves
  if (threadIdx.x == 0) {
    t.row_step[r] = static_cast<int32_t>(to);
    if (stats.counters) {
      atomicAdd(stats.counters + 0, 1ull);
      if (!cold) {
        atomicAdd(stats.counters + 1, 1ull);
        atomicAdd(stats.counters + 2, static_cast<unsigned long long>(to - have));
      }
    }
  }
}

// Block i (grid-stride), first <= i < the count: row ids[i].
__global__ void __launch_bounds__(kThreads)
    table_step_kernel(DeviceTable t, TableGrad tg, const int32_t* ids, const int32_t* first, const int32_t* count,
                      int64_t n, KeptConsts kept, int64_t step, bool dense, const float* grad_scale, TableStats stats) {
  pdl_wait();
  const AdamWConsts c = kept.consts[step - kept.base - 1];
  const float scale = grad_scale ? *grad_scale : 1.0f;
  const int64_t total = count ? *count : n;
  for (int64_t i = (first ? *first : 0) + blockIdx.x; i < total; i += gridDim.x) {
    const int64_t r = ids[i];
    if (dense) replay_row(t, r, step - 1, kept, stats);
    float* g = tg.g + r * t.d;
    for (int64_t j = threadIdx.x; j < t.d; j += blockDim.x) {
      const int64_t at = r * t.d + j;
      float pj = t.p[at], mj = t.m[at], vj = t.v[at];
      adamw_element(pj, mj, vj, g[j], true, scale, c);
      t.p[at] = pj;
      t.m[at] = mj;
      t.v[at] = vj;
      if (t.p_bf16) t.p_bf16[at] = __float2bfloat16_rn(pj);
      if (tg.zero_rows) g[j] = 0.0f;
    }
    __syncthreads();  // every thread has read row_step (replay_row) before it moves
    if (threadIdx.x == 0) {
      t.row_step[r] = static_cast<int32_t>(step);
      tg.touched[r] = 0;
      if (stats.counters) atomicAdd(stats.counters + 3, 1ull);
    }
  }
}

// ids null: every row; else ids[0 .. *count), the entries in subset, of table blockIdx.y (its rows
// from row blockIdx.y * table_rows of t, its entries subset's bit subset.bit + blockIdx.y).
__global__ void __launch_bounds__(kThreads)
    table_sync_kernel(DeviceTable t, const int32_t* ids, const int32_t* count, int64_t n, KeptConsts kept,
                      TableStats stats, RowSubset subset, int64_t table_rows) {
  pdl_wait();
  const int64_t total = ids ? (count ? *count : n) : t.rows, base = blockIdx.y * table_rows;
  const int bit = subset.bit + static_cast<int>(blockIdx.y);
  for (int64_t i = blockIdx.x; i < total; i += gridDim.x)
    if (!subset.bits || (subset.bits[i] >> bit & 1u))
      replay_row(t, base + (ids ? ids[i] : i), kept.current, kept, stats);
}

int blocks_for(int64_t rows) { return static_cast<int>(rows < kMaxBlocks ? (rows > 0 ? rows : 1) : kMaxBlocks); }

}  // namespace

void table_adamw_step(const DeviceTable& t, const TableGrad& g, const int32_t* ids, const int32_t* count, int64_t n,
                      const KeptConsts& kept, int64_t step, bool dense, const float* grad_scale, TableStats stats,
                      cudaStream_t stream, const int32_t* first) {
  JTOK_CHECK(step > kept.base && step <= kept.current, "table_adamw_step: step ", step, " has no kept constants (",
             kept.base + 1, "..", kept.current, ")");
  JTOK_CHECK(!dense || kept.current == step, "table_adamw_step: the kept constants end at ", kept.current,
             ", step ", step, " asked");
  if (n == 0) return;
  table_step_kernel<<<blocks_for(n), kThreads, 0, stream>>>(t, g, ids, first, count, n, kept, step, dense, grad_scale,
                                                            stats);
  JTOK_CUDA_CHECK_LAUNCH();
}

void table_sync_rows(const DeviceTable& t, const int32_t* ids, const int32_t* count, int64_t n, const KeptConsts& kept,
                     TableStats stats, cudaStream_t stream, RowSubset subset, int64_t tables, int64_t table_rows) {
  JTOK_CHECK(tables >= 1 && tables <= 32 && (tables == 1 || table_rows > 0), "table_sync_rows: ", tables, " tables of ",
             table_rows, " rows");
  if (n == 0 || kept.current == kept.base) return;
  table_sync_kernel<<<dim3(blocks_for(n), static_cast<unsigned>(tables)), kThreads, 0, stream>>>(
      t, ids, count, n, kept, stats, subset, table_rows);
  JTOK_CUDA_CHECK_LAUNCH();
}

void table_sync_all(const DeviceTable& t, const KeptConsts& kept, TableStats stats, cudaStream_t stream) {
  if (kept.current == kept.base) return;
  table_sync_kernel<<<blocks_for(t.rows), kThreads, 0, stream>>>(t, nullptr, nullptr, 0, kept, stats, RowSubset{}, 0);
  JTOK_CUDA_CHECK_LAUNCH();
}

}  // namespace jtok::cuda
