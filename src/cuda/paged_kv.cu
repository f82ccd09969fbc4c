// The paged KV cache's kernels (cuda/paged_kv.h): a step's fused q | k | v rows made ready (per-head
// norm, RoPE at each row's own position) with k, v appended to their page slots, in one kernel; and
// flash-decoding attention over the pages.
//
// paged_attention is one kernel, paged_partial: one block of kThreads per (row r, kv head g, chunk c)
// with c < nc(r) = ceil((pos[r] + 1) / kChunk); it reads the chunk's K and V rows once for the
// group's H / KV query heads and writes, per (row, head, chunk), the chunk's score maximum m, sum of
// exp l and unnormalised V sum o (hd) in fp32 to scratch. Grid (R, KV, ceil(max_len / kChunk));
// blocks past nc(r) return. The last of a (row, kv head)'s nc(r) blocks to finish (a counter a (row,
// kv head): atomics count arrivals, never sum values) combines the row's chunks in chunk order for
// the group's heads: out = sum_c exp(m_c - M) o_c / sum_c exp(m_c - M) l_c with M = max_c m_c.
// Both depend on the row's own position, sequence and q only (batch invariance), and every sum has a
// fixed order (no atomics): a row's bits are the same alone, in any batch and on every run.
// In paged_partial a K or V row of hd elements is read as 16-byte vectors: kVec elements a lane,
// kLanes lanes a row, kRows rows a warp at once (RowLanes); a score is a shuffle sum over the row's
// lanes, a V sum a shuffle sum over the warp's rows and then over the warps in order. A lane loads
// kRowsAhead of its rows (8 bf16, 4 fp32; their page-table entries first) before it uses the first
// (RowsAhead): a chunk is a stream of short rows whose loads in flight are its speed, and a decode
// step at batch 1 has few blocks (KV heads x chunks). Each score and each lane's V sum keeps its
// order, so the bits are those of a row at a time.
// tests/cuda/emulate_paged_kv.py transcribes both kernels lane by lane (no GPU needed).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "cuda/attention_mma.h"
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/paged_kv.h"
#include "cuda/pdl.cuh"

namespace jtok::cuda {
namespace {

constexpr int kChunk = static_cast<int>(kPagedAttentionChunk);  // fixed: nc(r) is pos[r]'s alone
constexpr int kWarps = 4;       // paged_partial: threads per block kWarps * 32
constexpr int kThreads = kWarps * 32;
constexpr int kHeadBatch = 4;   // query heads whose V sums a lane keeps in registers at once
// K or V rows a lane loads before it uses the first of them (fp32 rows: half as many, as registers allow).
template <typename KvT>
constexpr int kRowsAhead = sizeof(KvT) == 2 ? 8 : 4;
constexpr int kQkvWarps = 4;  // paged_qkv: warps a block
constexpr size_t kDefaultSmem = 48 * 1024;  // dynamic shared memory without the opt-in

template <int HD, typename KvT>
struct RowLanes {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(KvT));
  static constexpr int kLanes = HD / kVec;
  static constexpr int kRows = 32 / kLanes;
  static_assert(kLanes >= 1 && kLanes <= 32 && 32 % kLanes == 0, "a row spans a power of two of lanes");
};

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// The element offset of position p's (KV, hd) row in a pool: table lists the sequence's pages.
__device__ __forceinline__ int64_t slot_offset(const int32_t* table, int p, int page_tokens, int64_t kvd) {
  const int64_t page = table[p / page_tokens];
  return (page * page_tokens + p % page_tokens) * kvd;
}

// A lane's kRowsAhead<KvT> rows of a pass: row jj(u) = jj0 + u * stride of the chunk (those at or past
// len: not read, zeros), 16 raw bytes each at slice's place, every load issued before any is used
// (a K or V pass is a stream of short rows: the loads in flight are its speed), then read as fp32:
// 4 floats or 8 bf16.
template <typename KvT>
struct RowsAhead {
  static constexpr int N = kRowsAhead<KvT>;
  uint4 raw[N];

  __device__ __forceinline__ void load(const KvT* base, const int32_t* table, int j0, int jj0, int stride, int len,
                                       int page_tokens, int64_t kvd, int at) {
    int64_t off[N];
#pragma unroll
    for (int u = 0; u < N; ++u) {  // the page table's reads first: each row's load needs its own
      const int jj = jj0 + u * stride;
      off[u] = jj < len ? slot_offset(table, j0 + jj, page_tokens, kvd) + at : -1;
    }
#pragma unroll
    for (int u = 0; u < N; ++u)
      raw[u] = off[u] >= 0 ? __ldg(reinterpret_cast<const uint4*>(base + off[u])) : make_uint4(0, 0, 0, 0);
  }
  __device__ __forceinline__ void values(float (&out)[4], int u) const {  // fp32 rows
    out[0] = __uint_as_float(raw[u].x), out[1] = __uint_as_float(raw[u].y);
    out[2] = __uint_as_float(raw[u].z), out[3] = __uint_as_float(raw[u].w);
  }
  __device__ __forceinline__ void values(float (&out)[8], int u) const { bf16x8_to_f32(out, raw[u]); }  // bf16 rows
};

// E -> KvT: the same type copies the bits; else through fp32 (bf16 rounded to nearest even).
template <typename KvT, typename E>
__device__ __forceinline__ KvT to_kv(E x) {
  if constexpr (std::is_same_v<E, KvT>)
    return x;
  else
    return from_f32<KvT>(to_f32(x));
}

// Warp w of R * (H + KV): row r, slot j; j < H: q head j; else k head g = j - H and v head g. A q or
// k head: RMSNorm (with a gain) by warp_rms_scale and the element's rounding to E, then each pair
// rotated at pos[r] (rope_rotate) and rounded to E: rmsnorm_forward's and RoPE's bits. A k and v head
// also go to the pages (to_kv: E -> KvT rounded to nearest even). Lane l owns the pairs l, l + 32, ...
template <typename E, typename KvT>
__global__ void __launch_bounds__(kQkvWarps * 32)
    paged_qkv_kernel(QkvOut<E> out, QkvRows<E> in, PagedKv kv, PagedRows rows) {
  pdl_wait();
  const int64_t H = in.H, KV = kv.KV, hd = kv.hd, half = hd / 2, qd = H * hd, kvd = KV * hd;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kQkvWarps + (threadIdx.x >> 5);
  if (w >= rows.R * (H + KV)) return;
  const int lane = threadIdx.x & 31;
  const int64_t r = w / (H + KV), slot = w % (H + KV);
  const bool is_q = slot < H;
  const int64_t head = is_q ? slot : slot - H;
  const E* x = in.qkv + r * in.ld + (is_q ? 0 : qd) + head * hd;
  const E* gain = is_q ? in.q_norm : in.k_norm;
  const float rs = gain ? warp_rms_scale(x, hd, in.eps, lane) : 0.0f;
  const int64_t t = rows.pos[r];
  E* y = is_q ? out.q + r * qd + head * hd : out.k + r * kvd + head * hd;
  const int64_t at = is_q ? 0 : slot_offset(rows.page_tables + static_cast<int64_t>(rows.row_seq[r]) * rows.max_pages,
                                            static_cast<int>(t), static_cast<int>(kv.page_tokens), kvd) + head * hd;
  for (int64_t i = lane; i < half; i += 32) {
    float x1 = to_f32(x[i]), x2 = to_f32(x[i + half]);
    if (gain) {
      x1 = to_f32(from_f32<E>(x1 * rs * to_f32(gain[i])));
      x2 = to_f32(from_f32<E>(x2 * rs * to_f32(gain[i + half])));
    }
    float y1, y2;
    rope_rotate(x1, x2, in.cos[t * half + i], in.sin[t * half + i], y1, y2);
    const E e1 = from_f32<E>(y1), e2 = from_f32<E>(y2);
    y[i] = e1;
    y[i + half] = e2;
    if (!is_q) {
      static_cast<KvT*>(kv.k)[at + i] = to_kv<KvT>(e1);
      static_cast<KvT*>(kv.k)[at + i + half] = to_kv<KvT>(e2);
    }
  }
  if (is_q) return;
  const E* xv = in.qkv + r * in.ld + qd + kvd + head * hd;
  for (int64_t c = lane; c < hd; c += 32) {
    out.v[r * kvd + head * hd + c] = xv[c];
    static_cast<KvT*>(kv.v)[at + c] = to_kv<KvT>(xv[c]);
  }
}

// What one paged_partial block works on.
struct ChunkJob {
  const int32_t* table;  // the row's sequence's pages
  int j0, len;           // positions j0 .. j0 + len - 1
  int64_t part;          // (row, first head of the group, chunk) index into the m, l scratch
  int chunks;            // scratch entries a (row, head): ceil(max_len / kChunk)
};

// Row jj's scores against the group's query heads from its lanes' kx: ps[hh * kChunk + jj] = scale *
// q_hh . k, a lane's fmaf chain then the row's lanes' shuffle sum; the row's first lane writes (jj
// past len: nothing). Every lane of the warp calls it (the shuffles).
template <int HD, typename L>
__device__ __forceinline__ void row_scores(float* ps, const float* qs, const float (&kx)[L::kVec], int jj, int len,
                                           int slice, int group, float scale) {
  for (int hh = 0; hh < group; ++hh) {
    const float4* q4 = reinterpret_cast<const float4*>(qs + hh * HD + slice * L::kVec);
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < L::kVec / 4; ++e) {
      const float4 qv = q4[e];
      s = fmaf(qv.x, kx[4 * e], s);
      s = fmaf(qv.y, kx[4 * e + 1], s);
      s = fmaf(qv.z, kx[4 * e + 2], s);
      s = fmaf(qv.w, kx[4 * e + 3], s);
    }
#pragma unroll
    for (int o = L::kLanes / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (jj < len && slice == 0) ps[hh * kChunk + jj] = s * scale;
  }
}

// ps[hh * kChunk + jj] = scale * q_hh . k_(j0 + jj) for the group's heads hh (qs (group, HD) fp32):
// warp w's rows w kRows + sub + i stride, kRowsAhead of them loaded at once (RowsAhead).
template <int HD, typename KvT>
__device__ void chunk_scores(float* ps, const float* qs, const KvT* kbase, const ChunkJob& job, int page_tokens,
                             int64_t kvd, int group, float scale) {
  using L = RowLanes<HD, KvT>;
  constexpr int stride = kWarps * L::kRows;  // rows a pass of the block's warps
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane / L::kLanes, slice = lane % L::kLanes;
  for (int first = warp * L::kRows; first < job.len; first += RowsAhead<KvT>::N * stride) {  // uniform over the warp
    RowsAhead<KvT> rows;
    rows.load(kbase, job.table, job.j0, first + sub, stride, job.len, page_tokens, kvd, slice * L::kVec);
#pragma unroll
    for (int u = 0; u < RowsAhead<KvT>::N; ++u) {
      if (first + u * stride < job.len) {  // uniform: whether any of the warp's rows of pass u is in the chunk
        float kx[L::kVec];
        rows.values(kx, u);
        row_scores<HD, L>(ps, qs, kx, first + u * stride + sub, job.len, slice, group, scale);
      }
    }
  }
}

// Per head of the group (a warp each): the chunk's maximum m and sum of exp l to scratch, and the
// scores in ps replaced by exp(s - m).
__device__ void chunk_softmax(float* ps, const ChunkJob& job, int group, float* part_m, float* part_l) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int hh = warp; hh < group; hh += kWarps) {
    float* s = ps + hh * kChunk;
    float m = -INFINITY;
    for (int j = lane; j < job.len; j += 32) m = fmaxf(m, s[j]);
    m = warp_max(m);  // finite: the chunk holds a position
    float l = 0.0f;
    for (int j = lane; j < job.len; j += 32) {
      const float p = expf(s[j] - m);
      s[j] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) {
      part_m[job.part + static_cast<int64_t>(hh) * job.chunks] = m;
      part_l[job.part + static_cast<int64_t>(hh) * job.chunks] = l;
    }
  }
}

// A lane's V sums for the heads h0 .. h0 + nh - 1 over its rows jj = warp kRows + sub + i stride, in
// that order: acc[b] += ps[h0 + b][jj] v_jj (its slice), RowsAhead's rows loaded at once.
template <int HD, typename KvT>
__device__ __forceinline__ void lane_value_sums(float (&acc)[kHeadBatch][RowLanes<HD, KvT>::kVec], const float* ps,
                                                const KvT* vbase, const ChunkJob& job, int page_tokens, int64_t kvd,
                                                int h0, int nh) {
  using L = RowLanes<HD, KvT>;
  constexpr int stride = kWarps * L::kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane / L::kLanes, slice = lane % L::kLanes;
  for (int first = warp * L::kRows + sub; first < job.len; first += RowsAhead<KvT>::N * stride) {
    RowsAhead<KvT> rows;
    rows.load(vbase, job.table, job.j0, first, stride, job.len, page_tokens, kvd, slice * L::kVec);
#pragma unroll
    for (int u = 0; u < RowsAhead<KvT>::N; ++u) {
      const int jj = first + u * stride;
      if (jj < job.len) {  // rows past the chunk: none
        float vx[L::kVec];
        rows.values(vx, u);
#pragma unroll
        for (int b = 0; b < kHeadBatch; ++b) {
          if (b >= nh) break;
          const float p = ps[(h0 + b) * kChunk + jj];
#pragma unroll
          for (int e = 0; e < L::kVec; ++e) acc[b][e] = fmaf(p, vx[e], acc[b][e]);
        }
      }
    }
  }
}

// part_o (HD) of each head of the group = sum_jj ps[hh][jj] v_(j0 + jj), kHeadBatch heads per pass
// over V: a lane sums its rows, the warp's rows by shuffles, the warps in order through red.
template <int HD, typename KvT>
__device__ void chunk_values(float* part_o, float* red, const float* ps, const KvT* vbase, const ChunkJob& job,
                             int page_tokens, int64_t kvd, int group) {
  using L = RowLanes<HD, KvT>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane / L::kLanes, slice = lane % L::kLanes;
  for (int h0 = 0; h0 < group; h0 += kHeadBatch) {
    const int nh = min(kHeadBatch, group - h0);
    float acc[kHeadBatch][L::kVec] = {};
    lane_value_sums<HD, KvT>(acc, ps, vbase, job, page_tokens, kvd, h0, nh);
#pragma unroll
    for (int b = 0; b < kHeadBatch; ++b)
#pragma unroll
      for (int e = 0; e < L::kVec; ++e)
#pragma unroll
        for (int o = L::kLanes; o < 32; o <<= 1) acc[b][e] += __shfl_xor_sync(0xffffffffu, acc[b][e], o);
    if (sub == 0)
      for (int b = 0; b < nh; ++b)
#pragma unroll
        for (int e = 0; e < L::kVec; ++e) red[(warp * kHeadBatch + b) * HD + slice * L::kVec + e] = acc[b][e];
    __syncthreads();
    for (int i = threadIdx.x; i < nh * HD; i += kThreads) {
      const int b = i / HD, d = i % HD;
      float o = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) o += red[(w * kHeadBatch + b) * HD + d];
      part_o[(job.part + static_cast<int64_t>(h0 + b) * job.chunks) * HD + d] = o;
    }
    __syncthreads();  // red is rewritten by the next batch
  }
}

// Head h's element d of row r (n positions, nc chunks): the chunks' partial states combined in chunk
// order. Read past L1 (__ldcg): other blocks of this launch wrote them.
template <int HD, typename E>
__device__ void combine_element(E* out, const float* part_o, const float* part_m, const float* part_l, int r, int h,
                                int d, int H, int chunks, int nc) {
  const int64_t base = (static_cast<int64_t>(r) * H + h) * chunks;
  float M = -INFINITY;
  for (int c = 0; c < nc; ++c) M = fmaxf(M, __ldcg(part_m + base + c));
  float l = 0.0f, acc = 0.0f;
  for (int c = 0; c < nc; ++c) {
    const float w = expf(__ldcg(part_m + base + c) - M);
    l = fmaf(__ldcg(part_l + base + c), w, l);
    acc = fmaf(__ldcg(part_o + (base + c) * HD + d), w, acc);
  }
  out[(static_cast<int64_t>(r) * H + h) * HD + d] = from_f32<E>(acc / l);
}

// After a chunk's partials: the row's last chunk block to finish (counted per (row, kv head) in
// counters[r H + first head], which it sets back to 0) combines the group's heads. Every writer
// fences its partials before the block's count, so the last block reads them all.
template <int HD, typename E>
__device__ void combine_if_last(E* out, const float* part_o, const float* part_m, const float* part_l,
                                int32_t* counters, int r, int h0, int group, int H, int chunks, int nc) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counters + static_cast<int64_t>(r) * H + h0, 1) == nc - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i < group * HD; i += kThreads)
    combine_element<HD, E>(out, part_o, part_m, part_l, r, h0 + i / HD, i % HD, H, chunks, nc);
  if (threadIdx.x == 0) counters[static_cast<int64_t>(r) * H + h0] = 0;
}

// One block per (row, kv head, chunk): shared memory qs (group, HD), ps (group, kChunk), red
// (kWarps, kHeadBatch, HD), all fp32.
template <int HD, typename E, typename KvT>
__global__ void __launch_bounds__(kThreads)
    paged_partial(E* out, float* part_o, float* part_m, float* part_l, int32_t* counters, const E* q,
                  int64_t q_stride, PagedKv kv, PagedRows rows, int H, int chunks, int64_t max_len, float scale) {
  pdl_wait();
  const int r = blockIdx.x, g = blockIdx.y, c = blockIdx.z, group = H / static_cast<int>(kv.KV);
  const int64_t n = static_cast<int64_t>(rows.pos[r]) + 1;  // positions the row sees
  if (n <= 0 || n > max_len) {  // the caller's max_len was wrong: no answer (chunk 0 writes NaN)
    for (int i = threadIdx.x; c == 0 && i < group * HD; i += kThreads)
      out[(static_cast<int64_t>(r) * H + g * group) * HD + i] = from_f32<E>(NAN);
    return;
  }
  if (static_cast<int64_t>(c) * kChunk >= n) return;  // past the row's last chunk
  extern __shared__ __align__(16) float smem[];  // qs is read as float4
  float *qs = smem, *ps = qs + group * HD, *red = ps + group * kChunk;
  const int page_tokens = static_cast<int>(kv.page_tokens);
  const int64_t kvd = kv.KV * HD;
  const ChunkJob job{rows.page_tables + static_cast<int64_t>(rows.row_seq[r]) * rows.max_pages, c * kChunk,
                     static_cast<int>(min(static_cast<int64_t>(kChunk), n - static_cast<int64_t>(c) * kChunk)),
                     (static_cast<int64_t>(r) * H + static_cast<int64_t>(g) * group) * chunks + c, chunks};
  const E* qrow = q + static_cast<int64_t>(r) * q_stride + static_cast<int64_t>(g) * group * HD;
  for (int i = threadIdx.x; i < group * HD; i += kThreads) qs[i] = to_f32(qrow[i]);
  __syncthreads();
  chunk_scores<HD>(ps, qs, static_cast<const KvT*>(kv.k) + g * HD, job, page_tokens, kvd, group, scale);
  __syncthreads();
  chunk_softmax(ps, job, group, part_m, part_l);
  __syncthreads();
  chunk_values<HD>(part_o, red, ps, static_cast<const KvT*>(kv.v) + g * HD, job, page_tokens, kvd, group);
  combine_if_last<HD, E>(out, part_o, part_m, part_l, counters, r, g * group, group, H, chunks,
                         static_cast<int>((n + kChunk - 1) / kChunk));
}

int64_t chunks_for(int64_t max_len) { return (max_len + kChunk - 1) / kChunk; }

size_t partial_smem_bytes(int64_t group, int64_t hd) {
  return static_cast<size_t>(group * hd + group * kChunk + kWarps * kHeadBatch * hd) * sizeof(float);
}

// The shape checks of paged_attention: every refusal names its values.
void check_attention(const PagedKv& kv, const PagedRows& rows, int64_t H, int64_t q_stride, int64_t max_len) {
  const int64_t hd = kv.hd;
  if (!attention_head_dim_supported(hd)) fail("paged attention: head dim ", hd, " is not supported (32, 64 or 128)");
  if (H <= 0 || kv.KV <= 0 || H % kv.KV != 0 || H > 65535)
    fail("paged attention: H ", H, " query heads over KV ", kv.KV, " kv heads (KV must divide H, H <= 65535)");
  if (q_stride < H * hd) fail("paged attention: q rows of ", q_stride, " elements are shorter than H*hd = ", H * hd);
  if (kv.page_tokens <= 0) fail("paged attention: ", kv.page_tokens, " positions a page");
  if (rows.R < 0 || rows.R > INT32_MAX) fail("paged attention: ", rows.R, " rows");
  if (max_len <= 0 || chunks_for(max_len) > 65535)
    fail("paged attention: max_len ", max_len, " (1 .. ", int64_t{65535} * kChunk, " positions)");
  if (reinterpret_cast<uintptr_t>(kv.k) % 16 != 0 || reinterpret_cast<uintptr_t>(kv.v) % 16 != 0)
    fail("paged attention: the K / V pools (", kv.k, ", ", kv.v, ") are not 16-byte aligned");
  const size_t smem = partial_smem_bytes(H / kv.KV, hd);
  if (smem > 200 * 1024)
    fail("paged attention: ", H / kv.KV, " query heads a kv head at head dim ", hd, " need ", smem / 1024,
         " KiB of shared memory (200 at most)");
}

// The rows in groups of as many as the scratch holds, one launch a group: a row's chunks, partials
// and combine are its own, so the grouping changes no bits. counters: every launch leaves them zero.
template <int HD, typename E, typename KvT>
void launch_attention(E* out, const E* q, int64_t q_stride, const PagedKv& kv, const PagedRows& rows, int64_t H,
                      int64_t max_len, const PagedScratch& scratch, int32_t* counters, cudaStream_t stream) {
  const int64_t chunks = chunks_for(max_len), per_row = paged_attention_scratch(1, H, HD, max_len);
  const int64_t group = std::min(rows.R, scratch.floats / per_row);
  if (group < 1)
    fail("paged attention: a scratch of ", scratch.floats, " floats holds no row (", per_row, " floats a row of ", H,
         " heads over ", max_len, " positions)");
  const size_t smem = partial_smem_bytes(H / kv.KV, HD);
  if (smem > kDefaultSmem)
    JTOK_CUDA_CHECK(cudaFuncSetAttribute(paged_partial<HD, E, KvT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  float *part_o = scratch.data, *part_m = part_o + group * H * chunks * HD, *part_l = part_m + group * H * chunks;
  for (int64_t r0 = 0; r0 < rows.R; r0 += group) {
    PagedRows g = rows;  // rows r0 .. r0 + g.R - 1
    g.row_seq += r0, g.pos += r0, g.R = std::min(group, rows.R - r0);
    const dim3 grid(static_cast<unsigned>(g.R), static_cast<unsigned>(kv.KV), static_cast<unsigned>(chunks));
    paged_partial<HD, E, KvT><<<grid, kThreads, smem, stream>>>(
        out + r0 * H * HD, part_o, part_m, part_l, counters, q + r0 * q_stride, q_stride, kv, g, static_cast<int>(H),
        static_cast<int>(chunks), max_len, 1.0f / std::sqrt(static_cast<float>(HD)));
    JTOK_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

template <typename E, typename KvT>
void paged_qkv(const QkvOut<E>& out, const QkvRows<E>& in, const PagedKv& kv, const PagedRows& rows,
               cudaStream_t stream) {
  const int64_t hd = kv.hd, width = (in.H + 2 * kv.KV) * hd;
  if (kv.KV <= 0 || hd <= 0 || hd % 2 != 0 || kv.page_tokens <= 0 || in.H <= 0)
    fail("paged_qkv: H ", in.H, " KV ", kv.KV, " hd ", hd, " page_tokens ", kv.page_tokens,
         " (all positive, hd even)");
  if (in.ld < width) fail("paged_qkv: q | k | v rows of ", in.ld, " elements are shorter than (H + 2 KV) hd = ", width);
  if ((in.q_norm == nullptr) != (in.k_norm == nullptr)) fail("paged_qkv: a q norm without a k norm, or the reverse");
  if (rows.R < 0) fail("paged_qkv: ", rows.R, " rows");
  if (rows.R == 0) return;
  const int64_t warps = rows.R * (in.H + kv.KV);
  paged_qkv_kernel<E, KvT><<<ceil_div(warps, kQkvWarps), kQkvWarps * 32, 0, stream>>>(out, in, kv, rows);
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename E, typename KvT>
void paged_attention(E* out, const E* q, int64_t q_stride, const PagedKv& kv, const PagedRows& rows, int64_t H,
                     int64_t max_len, const PagedScratch& scratch, int32_t* counters, cudaStream_t stream) {
  check_attention(kv, rows, H, q_stride, max_len);
  if (rows.R == 0) return;
  with_head_dim(kv.hd, [&](auto d) {
    launch_attention<decltype(d)::value, E, KvT>(out, q, q_stride, kv, rows, H, max_len, scratch, counters, stream);
  });
}

#define JTOK_PAGED_KV(E, KvT)                                                                                      \
  template void paged_qkv<E, KvT>(const QkvOut<E>&, const QkvRows<E>&, const PagedKv&, const PagedRows&,           \
                                  cudaStream_t);                                                                   \
  template void paged_attention<E, KvT>(E*, const E*, int64_t, const PagedKv&, const PagedRows&, int64_t, int64_t, \
                                        const PagedScratch&, int32_t*, cudaStream_t);
JTOK_PAGED_KV(float, float)
JTOK_PAGED_KV(float, __nv_bfloat16)
JTOK_PAGED_KV(__nv_bfloat16, float)
JTOK_PAGED_KV(__nv_bfloat16, __nv_bfloat16)
#undef JTOK_PAGED_KV

}  // namespace jtok::cuda
