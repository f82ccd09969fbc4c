// The lane-level parts of the row-invariant products (src/cuda/row_invariant_linear.cu, whose head
// comment gives the order of the sums): the loads of a chunk (element by element, or raw words where
// aligned, the next chunk's weights ahead), the RMSNorm inside, the fmaf chains, the lane tree and the
// block's writes. Internal to that file.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common.cuh"

namespace jtok::cuda::row_invariant {

constexpr int kWarps = 4;  // a block's warps, splitting C by chunks
constexpr int kThreads = 32 * kWarps;
constexpr int kCols = 4;  // output columns a block
constexpr unsigned kFull = 0xffffffffu;

template <typename In>
constexpr int kVec = 16 / static_cast<int>(sizeof(In));  // elements a lane's 16 bytes hold

// A lane's V elements row[e0..e0+V) as fp32, 0 past C, element by element (any alignment; the vec
// path's load_raw + raw_values give the same values).
template <typename T, int V>
__device__ __forceinline__ void load_elems(float (&v)[V], const T* row, int64_t e0, int64_t C) {
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = e0 + j < C ? to_f32(row[e0 + j]) : 0.0f;
}

// A lane's V int8 weights q[e0..e0+V) of a row whose scale is s, as fp32 q * s (one rounded product
// each: the value model/lowp_weights.h's dequantisation gives, so an fp32 product of the dequantised
// matrix has the same bits), 0 past C, byte by byte.
template <int V>
__device__ __forceinline__ void load_q8(float (&v)[V], const int8_t* row, float s, int64_t e0, int64_t C) {
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = e0 + j < C ? __fmul_rn(static_cast<float>(row[e0 + j]), s) : 0.0f;
}

// A lane's B bytes of a chunk as raw words, loaded in one instruction (16, 8 or 4 bytes) where `in`
// (else zeros: the values past C read as 0, as load_elems / load_q8 give them). The vec path loads a
// chunk's rows this way, all of them before any is converted: no instruction that waits on one load
// stands between it and the next, so they are in flight together.
template <int B>
struct Raw {
  uint32_t u[B / 4];
};

template <int B>
__device__ __forceinline__ Raw<B> load_raw(const void* p, bool in) {
  static_assert(B == 16 || B == 8 || B == 4, "a lane loads 16, 8 or 4 bytes a row");
  Raw<B> r{};
  if (!in) return r;
  if constexpr (B == 16) {
    const uint4 q = __ldg(reinterpret_cast<const uint4*>(p));
    r.u[0] = q.x, r.u[1] = q.y, r.u[2] = q.z, r.u[3] = q.w;
  } else if constexpr (B == 8) {
    const uint2 q = __ldg(reinterpret_cast<const uint2*>(p));
    r.u[0] = q.x, r.u[1] = q.y;
  } else {
    r.u[0] = __ldg(reinterpret_cast<const unsigned*>(p));
  }
  return r;
}

// Raw words as the V fp32 values load_elems (T float / bf16) or load_q8 (T int8_t, scale s) give.
template <typename T, int V>
__device__ __forceinline__ void raw_values(float (&v)[V], const Raw<V* static_cast<int>(sizeof(T))>& r, float s) {
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = __uint_as_float(r.u[j]);
  } else if constexpr (std::is_same_v<T, int8_t>) {
#pragma unroll
    for (int j = 0; j < V; ++j) {  // byte j sign-extended: the int8 value
      const int q = static_cast<int>(r.u[j / 4] << (24 - 8 * (j % 4))) >> 24;
      v[j] = __fmul_rn(static_cast<float>(q), s);
    }
  } else {
    static_assert(V == 8, "bf16: 8 values a lane");
    uint4 q;
    q.x = r.u[0], q.y = r.u[1], q.z = r.u[2], q.w = r.u[3];
    bf16x8_to_f32(v, q);
  }
}

// The group's rows' RMSNorm scales into rstd (G), rmsnorm_forward's own: row r0 + g by warp g mod 4.
template <typename In, int G>
__device__ __forceinline__ void group_rstd(float (&rstd)[G], const In* inp, int64_t r0, int64_t M, int64_t C,
                                           float eps) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int g = warp; g < G; g += kWarps) {
    if (r0 + g >= M) break;
    const float r = warp_rms_scale(inp + (r0 + g) * C, C, eps, lane);
    if (lane == 0) rstd[g] = r;
  }
  __syncthreads();
}

// A lane's loaded elements as rmsnorm_forward stores them: x * r * gain, rounded to In.
template <typename In, int V>
__device__ __forceinline__ void apply_norm(float (&x)[V], const float (&gain)[V], float r) {
#pragma unroll
  for (int j = 0; j < V; ++j) x[j] = to_f32(from_f32<In>(x[j] * r * gain[j]));
}

// Sums each of v[0..N) over the warp's lanes by one tree: lanes l and l ^ o added for o = 16, 8, 4,
// 2, 1 (a + b is b + a: which lane adds is no matter). While n > 1 values remain a step also
// transposes (a lane keeps one half, its partner the other: n/2 shuffles, not n); after it a lane
// holds the values base .. base + n - 1, then plain butterflies. N a power of two.
template <int n, int o, int N>
__device__ __forceinline__ void warp_sums(float (&v)[N], int lane, int& base) {
  if constexpr (o > 0) {
    if constexpr (n > 1) {
      constexpr int h = n / 2;
      const bool upper = (lane & o) != 0;
#pragma unroll
      for (int i = 0; i < h; ++i) {
        const float send = upper ? v[i] : v[i + h];
        const float keep = upper ? v[i + h] : v[i];
        v[i] = keep + __shfl_xor_sync(kFull, send, o);
      }
      if (upper) base += h;
      warp_sums<h, o / 2>(v, lane, base);
    } else {
      v[0] += __shfl_xor_sync(kFull, v[0], o);
      warp_sums<1, o / 2>(v, lane, base);
    }
  }
}

// Column c's sum for row g of the group: the warps' partials in warp order.
template <int G>
__device__ __forceinline__ float column_sum(const float (&partial)[kWarps][kCols * G], int at) {
  float y = partial[0][at];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) y += partial[w][at];
  return y;
}

// The group's sums: each warp's per (column, row) -> partial[warp][c * G + g].
template <int G>
__device__ __forceinline__ void group_partials(float (&acc)[kCols * G], float (&partial)[kWarps][kCols * G]) {
  constexpr int N = kCols * G;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int base = 0;
  warp_sums<N, 16>(acc, lane, base);
  constexpr int held = N >= 32 ? N / 32 : 1;
  if (lane % (N >= 32 ? 1 : 32 / N) == 0) {  // lanes that differ in butterfly bits only hold equal sums
#pragma unroll
    for (int i = 0; i < held; ++i) partial[warp][base + i] = acc[i];
  }
  __syncthreads();
}

// SwiGLU (OC = 2F outputs of F columns): the block's columns are gate rows j0, j0 + 1 (c 0, 1) and
// up rows F + j0, F + j0 + 1 (c 2, 3); thread c * G + g (c < 2) rounds both sums to Out as the plain
// product stores them and writes out (M, F) = silu(gate) up at row r0 + g, column j0 + c.
template <typename Out, int G>
__device__ __forceinline__ void write_swiglu(float (&acc)[kCols * G], float (&partial)[kWarps][kCols * G], Out* out,
                                             int64_t r0, int64_t M, int64_t j0, int64_t F) {
  group_partials<G>(acc, partial);
  if (threadIdx.x < 2 * G) {
    const int c = static_cast<int>(threadIdx.x) / G, g = static_cast<int>(threadIdx.x) % G;
    const int64_t row = r0 + g, col = j0 + c;
    if (row < M && col < F) {
      const float gate = to_f32(from_f32<Out>(column_sum<G>(partial, c * G + g)));
      const float up = to_f32(from_f32<Out>(column_sum<G>(partial, (c + 2) * G + g)));
      out[row * F + col] = from_f32<Out>(swiglu_value(gate, up));
    }
  }
  __syncthreads();  // partial is the next group's
}

// Thread c * G + g adds the warps' partials in order, the bias, out (accumulate) and writes row
// r0 + g, column col0 + c.
template <typename Out, int G>
__device__ __forceinline__ void write_group(float (&acc)[kCols * G], float (&partial)[kWarps][kCols * G], Out* out,
                                            const Out* bias, int64_t r0, int64_t M, int64_t col0, int64_t OC,
                                            bool accumulate) {
  constexpr int N = kCols * G;
  group_partials<G>(acc, partial);
  if (threadIdx.x < N) {
    const int c = static_cast<int>(threadIdx.x) / G, g = static_cast<int>(threadIdx.x) % G;
    const int64_t row = r0 + g, col = col0 + c;
    if (row < M && col < OC) {
      float y = column_sum<G>(partial, static_cast<int>(threadIdx.x));
      if (bias) y += to_f32(bias[col]);
      Out* o = out + row * OC + col;
      if (accumulate) y = to_f32(*o) + y;
      *o = from_f32<Out>(y);
    }
  }
  __syncthreads();  // partial is the next group's
}

// A block's pass over its weight rows for the rows r0 .. r0 + G - 1 of inp (C wide): the rows (one a
// column), their int8 scales, the norm's gain (null: none) and the group's scales.
template <typename In, typename Wt, int G>
struct Pass {
  const Wt* w[kCols];
  float wsc[kCols];
  const In* inp;
  const In* gain;
  const float* rstd;
  int64_t r0, M, C, chunks;
};

// The fmaf chain of chunk element e0's V values: every row's loaded inputs x (normed when gain) times
// every column's weights, into acc (column-major by G).
template <typename In, typename Wt, int G, int V>
__device__ __forceinline__ void chunk_fmas(float (&acc)[kCols * G], const float (&w)[kCols][V], const float (&gw)[V],
                                           float (&x)[V], const Pass<In, Wt, G>& p, int g) {
  if (p.gain) apply_norm<In, V>(x, gw, p.rstd[g]);
#pragma unroll
  for (int c = 0; c < kCols; ++c)
#pragma unroll
    for (int j = 0; j < V; ++j) acc[c * G + g] = __fmaf_rn(w[c][j], x[j], acc[c * G + g]);
}

// Any alignment: each chunk's values loaded and converted a row at a time.
template <typename In, typename Wt, int G>
__device__ __forceinline__ void chunk_sums_any(float (&acc)[kCols * G], const Pass<In, Wt, G>& p) {
  constexpr int V = kVec<In>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t k = warp; k < p.chunks; k += kWarps) {
    const int64_t e0 = k * 32 * V + lane * V;
    float w[kCols][V], gw[V];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      if constexpr (std::is_same_v<Wt, int8_t>)
        load_q8<V>(w[c], p.w[c], p.wsc[c], e0, p.C);
      else
        load_elems<Wt, V>(w[c], p.w[c], e0, p.C);
    }
    if (p.gain) load_elems<In, V>(gw, p.gain, e0, p.C);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (p.r0 + g < p.M) {
        float x[V];
        load_elems<In, V>(x, p.inp + (p.r0 + g) * p.C, e0, p.C);
        chunk_fmas<In, Wt, G, V>(acc, w, gw, x, p, g);
      }
    }
  }
}

// vec (rows aligned, C a multiple of V: a lane's V values all in or all past C): the same fmaf chain
// over raw loads, the next chunk's weights loaded before this chunk's sums, so two chunks' weight
// loads are in flight a warp. The same values, so the same bits as chunk_sums_any.
template <typename In, typename Wt, int G>
__device__ __forceinline__ void chunk_sums_vec(float (&acc)[kCols * G], const Pass<In, Wt, G>& p) {
  constexpr int V = kVec<In>, WB = V * static_cast<int>(sizeof(Wt));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  Raw<WB> cur[kCols], next[kCols];
  auto load_weights = [&](Raw<WB>(&r)[kCols], int64_t k) {
    const int64_t e0 = k * 32 * V + lane * V;
#pragma unroll
    for (int c = 0; c < kCols; ++c) r[c] = load_raw<WB>(p.w[c] + e0, e0 < p.C);
  };
  load_weights(cur, warp);
  for (int64_t k = warp; k < p.chunks; k += kWarps) {
    const int64_t e0 = k * 32 * V + lane * V;
    if (k + kWarps < p.chunks) load_weights(next, k + kWarps);
    float w[kCols][V], gw[V];
    if (p.gain) raw_values<In, V>(gw, load_raw<16>(p.gain + e0, e0 < p.C), 0.0f);
#pragma unroll
    for (int c = 0; c < kCols; ++c) raw_values<Wt, V>(w[c], cur[c], p.wsc[c]);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (p.r0 + g < p.M) {
        float x[V];
        raw_values<In, V>(x, load_raw<16>(p.inp + (p.r0 + g) * p.C + e0, e0 < p.C), 0.0f);
        chunk_fmas<In, Wt, G, V>(acc, w, gw, x, p, g);
      }
    }
#pragma unroll
    for (int c = 0; c < kCols; ++c) cur[c] = next[c];
  }
}

}  // namespace jtok::cuda::row_invariant
