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
// Loads (chunk_sums_vec, rows aligned): raw 16 / 8 / 4-byte words, a chunk's weight rows all issued
// before any is converted and the next chunk's ahead of this chunk's sums, so a warp has up to two
// chunks' weights in flight (a decode step's products stream their weights once: the loads in flight
// are its speed). Any alignment (chunk_sums_any): element by element, the same values.
#include <climits>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/pdl.cuh"
#include "cuda/row_invariant_lanes.cuh"
#include "cuda/row_invariant_linear.h"

namespace jtok::cuda {

namespace {

using namespace row_invariant;

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

// A second product of the same rows in the same launch (row_invariant_linear_and_side): blocks from
// first_block on take its columns, written in fp32 with no bias and no accumulation. None: first_block
// past the grid.
template <typename Wt>
struct SideArgs {
  float* out = nullptr;
  const Wt* weight = nullptr;
  int64_t OC = 0, first_block = INT64_MAX;
};

// Block b: columns 4b..4b+3 of every row (SwiGLU: output columns 2b, 2b+1 of F = OC / 2, from the
// gate and up rows of each), G rows a group. G (1..16, by M) changes how many rows share a pass over
// the weights, never a row's own operations; a column's sum is the same in both kinds. Grouped
// (MoE's experts): block (b, i) takes expert e = g.experts[i] (none past *g.num_experts), its rows
// g.offsets[e] .. g.offsets[e+1] - 1 and its weight at weight + e g.stride; M is not read. A row's
// operations are the same either way (a template parameter: the plain kernels keep their registers).
// Wt: In (the weights in the inputs' type) or int8_t (Q8Weight: q * wscale[row]; grouped, expert e's
// scales at wscale + e g.scale_stride). Side (plain products of In weights only; a template parameter:
// the other kernels keep their registers): the blocks from side.first_block on are the side product's,
// its columns summed as the main product's are.
template <typename In, typename Out, typename Wt, int G, bool Swiglu, bool Grouped, bool Side = false>
__global__ void __launch_bounds__(kThreads)
    row_invariant_linear_kernel(Out* out, const In* inp, const Wt* weight, const float* wscale, const Out* bias,
                                int64_t M, int64_t C, int64_t OC, bool accumulate, bool vec, const In* gain, float eps,
                                ExpertRows g, SideArgs<Wt> side) {
  pdl_wait();
  constexpr int V = kVec<In>;
  constexpr bool kQ8 = std::is_same_v<Wt, int8_t>;
  __shared__ float partial[kWarps][kCols * G];
  __shared__ float rstd[G];  // with a norm: the group's rows' scales
  static_assert(!Side || (!Swiglu && !Grouped && !kQ8), "a side product beside a plain product only");
  const bool in_side = Side && blockIdx.x >= side.first_block;
  if (in_side) weight = side.weight, OC = side.OC;
  const int64_t col0 = (blockIdx.x - (in_side ? side.first_block : 0)) * (Swiglu ? 2 : kCols);
  const int64_t chunks = (C + 32 * V - 1) / (32 * V);
  int64_t first = 0;  // the block's rows: first .. M - 1
  if constexpr (Grouped) {
    if (static_cast<int>(blockIdx.y) >= *g.num_experts) return;  // the whole block: no barrier is left waiting
    const int e = g.experts[blockIdx.y];
    first = g.offsets[e], M = g.offsets[e + 1];
    weight += e * g.stride;
    if constexpr (kQ8) wscale += e * g.scale_stride;
  }
  Pass<In, Wt, G> p{{}, {}, inp, gain, rstd, first, M, C, chunks};
#pragma unroll
  for (int c = 0; c < kCols; ++c) {  // the block's weight rows (int8: and their scales)
    const int64_t row = weight_row<Swiglu>(c, col0, OC);
    p.w[c] = weight + row * C;
    p.wsc[c] = kQ8 ? __ldg(wscale + row) : 0.0f;
  }
  for (; p.r0 < M; p.r0 += G) {
    const int64_t r0 = p.r0;
    if (gain) group_rstd<In, G>(rstd, inp, r0, M, C, eps);
    float acc[kCols * G];
#pragma unroll
    for (int i = 0; i < kCols * G; ++i) acc[i] = 0.0f;
    if (vec)
      chunk_sums_vec<In, Wt, G>(acc, p);
    else
      chunk_sums_any<In, Wt, G>(acc, p);
    if constexpr (Swiglu) write_swiglu<Out, G>(acc, partial, out, r0, M, col0, OC / 2);
    else if (in_side)
      write_group<float, G>(acc, partial, side.out, nullptr, r0, M, col0, OC, false);
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
  SideArgs<Wt> side = {};  // first_block set by the launch
};

template <typename In, typename Out, typename Wt, int G, bool Swiglu, bool Grouped, bool Side>
void launch(const ProductArgs<In, Out, Wt>& p, cudaStream_t stream) {
  // A lane's loads: 16 bytes of inputs, V weights (16 bytes, int8 V bytes); every expert's rows keep
  // the alignment when the stride is a multiple of V too.
  constexpr int64_t V = kVec<In>;
  const auto weights_vec = [](const Wt* w) { return reinterpret_cast<uintptr_t>(w) % (V * sizeof(Wt)) == 0; };
  const bool vec = aligned16(p.inp) && weights_vec(p.weight) && (!p.side.out || weights_vec(p.side.weight)) &&
                   (!p.norm.gain || aligned16(p.norm.gain)) && p.C % V == 0 && p.groups.stride % V == 0;
  const int64_t blocks = Swiglu ? (p.OC / 2 + 1) / 2 : (p.OC + kCols - 1) / kCols;
  SideArgs<Wt> side = p.side;
  if (side.out) side.first_block = blocks;
  const int64_t side_blocks = side.out ? (side.OC + kCols - 1) / kCols : 0;
  const dim3 grid(static_cast<unsigned>(blocks + side_blocks),
                  static_cast<unsigned>(Grouped ? p.groups.max_experts : 1));
  row_invariant_linear_kernel<In, Out, Wt, G, Swiglu, Grouped, Side>
      <<<grid, kThreads, 0, stream>>>(p.out, p.inp, p.weight, p.wscale, p.bias, p.M, p.C, p.OC, p.accumulate, vec,
                                      p.norm.gain, p.norm.eps, p.groups, side);
  JTOK_CUDA_CHECK_LAUNCH();
}

// The fewest rows a pass that hold M (up to 16): no idle accumulators at M = 1, 2, 4, 8, 16.
template <typename In, typename Out, bool Swiglu, bool Grouped = false, typename Wt = In, bool Side = false>
void launch_rows(const ProductArgs<In, Out, Wt>& p, cudaStream_t stream) {
  if (p.M == 1)
    launch<In, Out, Wt, 1, Swiglu, Grouped, Side>(p, stream);
  else if (p.M == 2)
    launch<In, Out, Wt, 2, Swiglu, Grouped, Side>(p, stream);
  else if (p.M <= 4)
    launch<In, Out, Wt, 4, Swiglu, Grouped, Side>(p, stream);
  else if (p.M <= 8)
    launch<In, Out, Wt, 8, Swiglu, Grouped, Side>(p, stream);
  else
    launch<In, Out, Wt, 16, Swiglu, Grouped, Side>(p, stream);
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

template <typename In, typename Out>
void row_invariant_linear_and_side(Out* out, const In* inp, const In* weight, const Out* bias, int64_t M, int64_t C,
                                   int64_t OC, bool accumulate, float* side_out, const In* side_weight, int64_t side_OC,
                                   cudaStream_t stream, const RowNorm<In>& norm) {
  if (M < 0 || C < 1 || OC < 1 || side_OC < 1 || !side_out || !side_weight ||
      (OC + kCols - 1) / kCols + (side_OC + kCols - 1) / kCols > INT_MAX)
    fail("cuda row_invariant_linear_and_side: bad shape M ", M, " C ", C, " OC ", OC, " side OC ", side_OC,
         " or no side output / weight");
  if (M == 0) return;
  ProductArgs<In, Out> p{out, inp, weight, bias, M, C, OC, accumulate, norm, {}};
  p.side = {side_out, side_weight, side_OC};
  launch_rows<In, Out, false, false, In, true>(p, stream);
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
#define JTOK_ROW_INVARIANT_AND_SIDE_INSTANTIATE(T)                                                                     \
  template void row_invariant_linear_and_side<T, T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, bool, \
                                                    float*, const T*, int64_t, cudaStream_t, const RowNorm<T>&);
JTOK_ROW_INVARIANT_AND_SIDE_INSTANTIATE(float)
JTOK_ROW_INVARIANT_AND_SIDE_INSTANTIATE(bf16)
#undef JTOK_ROW_INVARIANT_AND_SIDE_INSTANTIATE
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
