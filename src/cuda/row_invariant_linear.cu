// The row-invariant linear forward (src/cuda/row_invariant_linear.h). A row's output element is
//   y = ((w0 + w1) + w2) + w3  (+ bias) (then out + y when accumulating)
// where warp w's sum wq is its lanes' partials added by the tree lanes l and l ^ o make for o = 16,
// 8, 4, 2, 1, and lane l's partial is fmaf over its elements in order: chunk k = w, w + 4, ... (32
// lanes x V elements a chunk, V = 16 bytes / sizeof(In)), in a chunk elements k*32V + l*V + j,
// j = 0..V-1 (those past C read as 0: fmaf(0, 0, acc) = acc, acc never being -0 as it starts at +0).
// Nothing in it names M, the row's index or the group it went through: the bits are the row's own.
// row_invariant_swiglu runs the same sums for a gate | up product's two halves and writes SwiGLU of
// the pair (each rounded to the storage type first, as the product would store it): one kernel.
// With a norm (RowNorm) a group's rows get their RMSNorm scales first (warp w: rows w, w + 4, ...,
// warp_rms_scale as rmsnorm_forward), and each loaded element x becomes x * rstd * gain rounded to
// In, rmsnorm_forward's stored value, before the sums: the product's input is that norm's output.
#include <climits>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/pdl.cuh"
#include "cuda/row_invariant_linear.h"

namespace jtok::cuda {

namespace {

constexpr int kWarps = 4;                 // a block's warps, splitting C by chunks
constexpr int kThreads = 32 * kWarps;
constexpr int kCols = 4;                  // output columns a block
constexpr unsigned kFull = 0xffffffffu;

template <typename In>
constexpr int kVec = 16 / static_cast<int>(sizeof(In));  // elements a lane's 16 bytes hold

// A lane's V elements row[e0..e0+V) as fp32, 0 past C. One 16-byte load when vec (the caller's
// promise: row 16-byte aligned and C a multiple of V, so a chunk is whole or wholly past C), else
// element by element: the same values either way.
__device__ __forceinline__ void load_elems(float (&v)[4], const float* row, int64_t e0, int64_t C, bool vec) {
  if (vec && e0 < C) {
    const float4 q = __ldg(reinterpret_cast<const float4*>(row + e0));
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = e0 + j < C ? __ldg(row + e0 + j) : 0.0f;
}

__device__ __forceinline__ void load_elems(float (&v)[8], const __nv_bfloat16* row, int64_t e0, int64_t C, bool vec) {
  if (vec && e0 < C) {
    bf16x8_to_f32(v, __ldg(reinterpret_cast<const uint4*>(row + e0)));
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = e0 + j < C ? __bfloat162float(row[e0 + j]) : 0.0f;
}

// A lane's V int8 weights q[e0..e0+V) of a row whose scale is s, as fp32 q * s (one rounded product
// each: the value model/lowp_weights.h's dequantisation gives, so an fp32 product of the dequantised
// matrix has the same bits), 0 past C. One V-byte load when vec (the row V-byte aligned, C a multiple
// of V), else byte by byte.
template <int V>
__device__ __forceinline__ void load_q8(float (&v)[V], const int8_t* row, float s, int64_t e0, int64_t C, bool vec) {
  static_assert(V == 4 || V == 8, "int8 weights go with fp32 (V 4) or bf16 (V 8) inputs");
  if (vec && e0 < C) {
    unsigned u[V / 4];
    if constexpr (V == 4) {
      u[0] = __ldg(reinterpret_cast<const unsigned*>(row + e0));
    } else {
      const uint2 q = __ldg(reinterpret_cast<const uint2*>(row + e0));
      u[0] = q.x;
      u[1] = q.y;
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {  // byte j sign-extended: the int8 value
      const int q = static_cast<int>(u[j / 4] << (24 - 8 * (j % 4))) >> 24;
      v[j] = __fmul_rn(static_cast<float>(q), s);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = e0 + j < C ? __fmul_rn(static_cast<float>(row[e0 + j]), s) : 0.0f;
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

// The weight row of the block's column c: plain, col0 + c (a column past OC reads column OC-1's
// weights and writes nothing); SwiGLU (OC = 2F, col0 = j0), gate rows j0 + c (c < 2) and up rows
// F + j0 + c - 2, each clamped into its half likewise.
template <bool Swiglu>
__device__ __forceinline__ int64_t weight_row(int c, int64_t col0, int64_t OC) {
  if constexpr (Swiglu) {
    const int64_t F = OC / 2, j = col0 + (c & 1);
    return (c < 2 ? 0 : F) + (j < F ? j : F - 1);
  } else {
    return col0 + c < OC ? col0 + c : OC - 1;
  }
}

// Block b: columns 4b..4b+3 of every row (SwiGLU: output columns 2b, 2b+1 of F = OC / 2, from the
// gate and up rows of each), G rows a group. G (1..16, by M) changes how many rows share a pass over
// the weights, never a row's own operations; a column's sum is the same in both kinds. Grouped
// (MoE's experts): block (b, i) takes expert e = g.experts[i] (none past *g.num_experts), its rows
// g.offsets[e] .. g.offsets[e+1] - 1 and its weight at weight + e g.stride; M is not read. A row's
// operations are the same either way (a template parameter: the plain kernels keep their registers).
// Wt: In (the weights in the inputs' type) or int8_t (Q8Weight: q * wscale[row]; grouped, expert e's
// scales at wscale + e g.scale_stride).
template <typename In, typename Out, typename Wt, int G, bool Swiglu, bool Grouped>
__global__ void __launch_bounds__(kThreads)
    row_invariant_linear_kernel(Out* out, const In* inp, const Wt* weight, const float* wscale, const Out* bias,
                                int64_t M, int64_t C, int64_t OC, bool accumulate, bool vec, const In* gain, float eps,
                                ExpertRows g) {
  pdl_wait();
  constexpr int V = kVec<In>;
  constexpr bool kQ8 = std::is_same_v<Wt, int8_t>;
  __shared__ float partial[kWarps][kCols * G];
  __shared__ float rstd[G];  // with a norm: the group's rows' scales
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * (Swiglu ? 2 : kCols);
  const int64_t chunks = (C + 32 * V - 1) / (32 * V);
  int64_t first = 0;  // the block's rows: first .. M - 1
  if constexpr (Grouped) {
    if (static_cast<int>(blockIdx.y) >= *g.num_experts) return;  // the whole block: no barrier is left waiting
    const int e = g.experts[blockIdx.y];
    first = g.offsets[e], M = g.offsets[e + 1];
    weight += e * g.stride;
    if constexpr (kQ8) wscale += e * g.scale_stride;
  }
  float wsc[kCols];  // int8: the block's weight rows' scales
#pragma unroll
  for (int c = 0; c < kCols; ++c) wsc[c] = kQ8 ? __ldg(wscale + weight_row<Swiglu>(c, col0, OC)) : 0.0f;
  for (int64_t r0 = first; r0 < M; r0 += G) {
    if (gain) group_rstd<In, G>(rstd, inp, r0, M, C, eps);
    float acc[kCols * G];
#pragma unroll
    for (int i = 0; i < kCols * G; ++i) acc[i] = 0.0f;
    for (int64_t k = warp; k < chunks; k += kWarps) {
      const int64_t e0 = k * 32 * V + lane * V;
      float w[kCols][V], gw[V];
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const Wt* row = weight + weight_row<Swiglu>(c, col0, OC) * C;
        if constexpr (kQ8)
          load_q8<V>(w[c], row, wsc[c], e0, C, vec);
        else
          load_elems(w[c], row, e0, C, vec);
      }
      if (gain) load_elems(gw, gain, e0, C, vec);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (r0 + g < M) {
          float x[V];
          load_elems(x, inp + (r0 + g) * C, e0, C, vec);
          if (gain) apply_norm<In, V>(x, gw, rstd[g]);
#pragma unroll
          for (int c = 0; c < kCols; ++c)
#pragma unroll
            for (int j = 0; j < V; ++j) acc[c * G + g] = __fmaf_rn(w[c][j], x[j], acc[c * G + g]);
        }
      }
    }
    if constexpr (Swiglu) write_swiglu<Out, G>(acc, partial, out, r0, M, col0, OC / 2);
    else write_group<Out, G>(acc, partial, out, bias, r0, M, col0, OC, accumulate);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// One product's arguments, as the launches pass them on. Grouped (groups.offsets set): M is
// groups.max_rows (it picks G). Wt int8_t: wscale holds the weight rows' scales.
template <typename In, typename Out, typename Wt = In>
struct ProductArgs {
  Out* out;
  const In* inp;
  const Wt* weight;
  const Out* bias;
  int64_t M, C, OC;
  bool accumulate;
  RowNorm<In> norm;
  ExpertRows groups;
  const float* wscale = nullptr;
};

template <typename In, typename Out, typename Wt, int G, bool Swiglu, bool Grouped>
void launch(const ProductArgs<In, Out, Wt>& p, cudaStream_t stream) {
  // A lane's loads: 16 bytes of inputs, V weights (16 bytes, int8 V bytes); every expert's rows keep
  // the alignment when the stride is a multiple of V too.
  constexpr int64_t V = kVec<In>;
  const bool vec = aligned16(p.inp) && reinterpret_cast<uintptr_t>(p.weight) % (V * sizeof(Wt)) == 0 &&
                   (!p.norm.gain || aligned16(p.norm.gain)) && p.C % V == 0 && p.groups.stride % V == 0;
  const int64_t blocks = Swiglu ? (p.OC / 2 + 1) / 2 : (p.OC + kCols - 1) / kCols;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(Grouped ? p.groups.max_experts : 1));
  row_invariant_linear_kernel<In, Out, Wt, G, Swiglu, Grouped><<<grid, kThreads, 0, stream>>>(
      p.out, p.inp, p.weight, p.wscale, p.bias, p.M, p.C, p.OC, p.accumulate, vec, p.norm.gain, p.norm.eps, p.groups);
  JTOK_CUDA_CHECK_LAUNCH();
}

// The fewest rows a pass that hold M (up to 16): no idle accumulators at M = 1, 2, 4, 8, 16.
template <typename In, typename Out, bool Swiglu, bool Grouped = false, typename Wt = In>
void launch_rows(const ProductArgs<In, Out, Wt>& p, cudaStream_t stream) {
  if (p.M == 1)
    launch<In, Out, Wt, 1, Swiglu, Grouped>(p, stream);
  else if (p.M == 2)
    launch<In, Out, Wt, 2, Swiglu, Grouped>(p, stream);
  else if (p.M <= 4)
    launch<In, Out, Wt, 4, Swiglu, Grouped>(p, stream);
  else if (p.M <= 8)
    launch<In, Out, Wt, 8, Swiglu, Grouped>(p, stream);
  else
    launch<In, Out, Wt, 16, Swiglu, Grouped>(p, stream);
}

}  // namespace

template <typename In, typename Out>
void row_invariant_linear(Out* out, const In* inp, const In* weight, const Out* bias, int64_t M, int64_t C,
                          int64_t OC, bool accumulate, cudaStream_t stream, const RowNorm<In>& norm) {
  if (M < 0 || C < 1 || OC < 1 || (OC + kCols - 1) / kCols > INT_MAX)
    fail("cuda row_invariant_linear: bad shape M ", M, " C ", C, " OC ", OC);
  if (M == 0) return;
  launch_rows<In, Out, false>({out, inp, weight, bias, M, C, OC, accumulate, norm, {}}, stream);
}

template <typename T>
void row_invariant_swiglu(T* out, const T* inp, const T* weight, int64_t M, int64_t C, int64_t F,
                          cudaStream_t stream, const RowNorm<T>& norm) {
  if (M < 0 || C < 1 || F < 1 || (F + 1) / 2 > INT_MAX)
    fail("cuda row_invariant_swiglu: bad shape M ", M, " C ", C, " F ", F);
  if (M == 0) return;
  launch_rows<T, T, true>({out, inp, weight, nullptr, M, C, 2 * F, false, norm, {}}, stream);
}

template <typename In, typename Out>
void row_invariant_linear_q8(Out* out, const In* inp, const Q8Weight& weight, const Out* bias, int64_t M, int64_t C,
                             int64_t OC, bool accumulate, cudaStream_t stream, const RowNorm<In>& norm) {
  if (M < 0 || C < 1 || OC < 1 || (OC + kCols - 1) / kCols > INT_MAX || !weight.q || !weight.scale)
    fail("cuda row_invariant_linear_q8: bad shape M ", M, " C ", C, " OC ", OC, " or no int8 weight / scales");
  if (M == 0) return;
  ProductArgs<In, Out, int8_t> p{out, inp, weight.q, bias, M, C, OC, accumulate, norm, {}, weight.scale};
  launch_rows<In, Out, false, false, int8_t>(p, stream);
}

template <typename T>
void row_invariant_swiglu_q8(T* out, const T* inp, const Q8Weight& weight, int64_t M, int64_t C, int64_t F,
                             cudaStream_t stream, const RowNorm<T>& norm) {
  if (M < 0 || C < 1 || F < 1 || (F + 1) / 2 > INT_MAX || !weight.q || !weight.scale)
    fail("cuda row_invariant_swiglu_q8: bad shape M ", M, " C ", C, " F ", F, " or no int8 weight / scales");
  if (M == 0) return;
  ProductArgs<T, T, int8_t> p{out, inp, weight.q, nullptr, M, C, 2 * F, false, norm, {}, weight.scale};
  launch_rows<T, T, true, false, int8_t>(p, stream);
}

namespace {

// The grouped launches (OC: the weight rows an expert's block reads), their shapes checked first;
// int8 weights (Wt int8_t) need their scales, an expert's block reading OC of them.
template <typename In, typename Out, bool Swiglu, typename Wt>
void launch_experts(const char* who, Out* out, const In* inp, const Wt* weight, const float* scale, const ExpertRows& g,
                    int64_t C, int64_t OC, cudaStream_t stream) {
  constexpr bool q8 = std::is_same_v<Wt, int8_t>;
  if (!g.offsets || !g.experts || !g.num_experts || g.max_experts < 1 || g.max_experts > 65535 || g.max_rows < 0 ||
      C < 1 || OC < 1 || g.stride < OC * C || (OC + kCols - 1) / kCols > INT_MAX || (q8 && g.scale_stride < OC))
    fail("cuda ", who, ": bad shape: experts ", g.max_experts, " rows ", g.max_rows, " C ", C, " OC ", OC, " stride ",
         g.stride, q8 ? " scale stride " + std::to_string(g.scale_stride) : std::string());
  if (q8 && (!weight || !scale)) fail("cuda ", who, ": no int8 weight / scales");
  if (g.max_rows == 0) return;
  launch_rows<In, Out, Swiglu, true, Wt>({out, inp, weight, nullptr, g.max_rows, C, OC, false, {}, g, scale}, stream);
}

}  // namespace

template <typename In, typename Out>
void row_invariant_expert_linear(Out* out, const In* inp, const In* weight, const ExpertRows& groups, int64_t C,
                                 int64_t OC, cudaStream_t stream) {
  launch_experts<In, Out, false>("row_invariant_expert_linear", out, inp, weight, nullptr, groups, C, OC, stream);
}

template <typename T>
void row_invariant_expert_swiglu(T* out, const T* inp, const T* weight, const ExpertRows& groups, int64_t C, int64_t F,
                                 cudaStream_t stream) {
  launch_experts<T, T, true>("row_invariant_expert_swiglu", out, inp, weight, nullptr, groups, C, 2 * F, stream);
}

template <typename T>
void row_invariant_expert_linear_q8(T* out, const T* inp, const Q8Weight& weight, const ExpertRows& groups, int64_t C,
                                    int64_t OC, cudaStream_t stream) {
  launch_experts<T, T, false>("row_invariant_expert_linear_q8", out, inp, weight.q, weight.scale, groups, C, OC,
                              stream);
}

template <typename T>
void row_invariant_expert_swiglu_q8(T* out, const T* inp, const Q8Weight& weight, const ExpertRows& groups, int64_t C,
                                    int64_t F, cudaStream_t stream) {
  launch_experts<T, T, true>("row_invariant_expert_swiglu_q8", out, inp, weight.q, weight.scale, groups, C, 2 * F,
                             stream);
}

using bf16 = __nv_bfloat16;
#define JTOK_ROW_INVARIANT_LINEAR_INSTANTIATE(In, Out)                                                           \
  template void row_invariant_linear<In, Out>(Out*, const In*, const In*, const Out*, int64_t, int64_t, int64_t, \
                                              bool, cudaStream_t, const RowNorm<In>&);
JTOK_ROW_INVARIANT_LINEAR_INSTANTIATE(float, float)
JTOK_ROW_INVARIANT_LINEAR_INSTANTIATE(bf16, bf16)
JTOK_ROW_INVARIANT_LINEAR_INSTANTIATE(bf16, float)
#undef JTOK_ROW_INVARIANT_LINEAR_INSTANTIATE
template void row_invariant_swiglu<float>(float*, const float*, const float*, int64_t, int64_t, int64_t, cudaStream_t,
                                          const RowNorm<float>&);
template void row_invariant_swiglu<bf16>(bf16*, const bf16*, const bf16*, int64_t, int64_t, int64_t, cudaStream_t,
                                         const RowNorm<bf16>&);
#define JTOK_ROW_INVARIANT_EXPERTS_INSTANTIATE(T)                                                                  \
  template void row_invariant_expert_linear<T, T>(T*, const T*, const T*, const ExpertRows&, int64_t, int64_t,      \
                                                  cudaStream_t);                                                     \
  template void row_invariant_expert_swiglu<T>(T*, const T*, const T*, const ExpertRows&, int64_t, int64_t, cudaStream_t);
JTOK_ROW_INVARIANT_EXPERTS_INSTANTIATE(float)
JTOK_ROW_INVARIANT_EXPERTS_INSTANTIATE(bf16)
#undef JTOK_ROW_INVARIANT_EXPERTS_INSTANTIATE
#define JTOK_ROW_INVARIANT_EXPERTS_Q8_INSTANTIATE(T)                                                                  \
  template void row_invariant_expert_linear_q8<T>(T*, const T*, const Q8Weight&, const ExpertRows&, int64_t, int64_t, \
                                                  cudaStream_t);                                                      \
  template void row_invariant_expert_swiglu_q8<T>(T*, const T*, const Q8Weight&, const ExpertRows&, int64_t, int64_t, \
                                                  cudaStream_t);
JTOK_ROW_INVARIANT_EXPERTS_Q8_INSTANTIATE(float)
JTOK_ROW_INVARIANT_EXPERTS_Q8_INSTANTIATE(bf16)
#undef JTOK_ROW_INVARIANT_EXPERTS_Q8_INSTANTIATE
#define JTOK_ROW_INVARIANT_Q8_INSTANTIATE(In, Out)                                                               \
  template void row_invariant_linear_q8<In, Out>(Out*, const In*, const Q8Weight&, const Out*, int64_t, int64_t, \
                                                 int64_t, bool, cudaStream_t, const RowNorm<In>&);
JTOK_ROW_INVARIANT_Q8_INSTANTIATE(float, float)
JTOK_ROW_INVARIANT_Q8_INSTANTIATE(bf16, bf16)
JTOK_ROW_INVARIANT_Q8_INSTANTIATE(bf16, float)
#undef JTOK_ROW_INVARIANT_Q8_INSTANTIATE
template void row_invariant_swiglu_q8<float>(float*, const float*, const Q8Weight&, int64_t, int64_t, int64_t,
                                             cudaStream_t, const RowNorm<float>&);
template void row_invariant_swiglu_q8<bf16>(bf16*, const bf16*, const Q8Weight&, int64_t, int64_t, int64_t,
                                            cudaStream_t, const RowNorm<bf16>&);

}  // namespace jtok::cuda
