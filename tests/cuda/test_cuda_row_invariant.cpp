// The row-invariant linear forward (src/cuda/row_invariant_linear.h), the decode steps' products:
// - against the CPU's linear_forward (ops/linear.h; + bias, + out for accumulate, added here) by
//   normalised error, through tests/cuda/cuda_case.h, on Qwen3-0.6B's shapes (C 1024 -> 2048 / 1024
//   / 3072, 2048 -> 1024, 3072 -> 1024, the LM head 1024 -> 151936) and an odd C with OC not a
//   multiple of the block's 4 columns, M 1, 3, 16, 33 (the LM head: 1, 16). Tolerances: fp32
//   1e-6 (fp32 sums on both sides in other orders: this kernel's order is about 1.1e-7 from fp64
//   at these C by tests/cuda/emulate_row_invariant.py); bf16 5e-3 for bf16 outputs (the inputs rounded on both
//   sides, the output rounded once: at most 2^-8 relative, 1.7e-3 normalised on normal values) and
//   1e-6 for the fp32 outputs of bf16 inputs (the LM head's (bf16, fp32)).
// - the property: each row of a product of M rows (M 2, 5, 16, 33; bias and accumulate on) equals
//   bit for bit the same row computed alone, from an aligned copy and from a copy one element off
//   16-byte alignment (the element-by-element loads), for (fp32, fp32), (bf16, bf16), (bf16, fp32).
// - linear_forward under RowInvariantProducts gives row_invariant_linear's bits, and the setting
//   is back to 0 after the scope.
// - with a norm (RowNorm), the product and the SwiGLU product give rmsnorm_forward's output followed by
//   the plain kernel, bit for bit.
// - a side product in the same launch (row_invariant_linear_and_side) gives both products their own
//   calls' bits.
// - MoE's grouped products (row_invariant_expert_linear / _swiglu, by offsets on the device) give
//   each expert's rows the bits of the plain kernel over that expert's rows and weight alone.
// - the tensor-core twin (row_invariant_mma.h, bf16 inputs): against the CPU as above (bf16 outputs
//   5e-3; fp32 outputs 1e-5, the tensor cores' fp32 sums not being fmaf in a fixed order) on
//   Qwen3-0.6B's shapes and a C that is a multiple of 8 but not of its 32-element chunks with OC not
//   a multiple of its 8 columns; each row's bits alone; its SwiGLU and normed forms the bits of its
//   plain product followed by swiglu_forward / preceded by rmsnorm_forward; unaligned inputs and
//   other C refused.
// `--gtest_filter='*CudaRowInvariant*'`; a GPU host only (in test_cuda_ops).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/matmul.h"
#include "cuda/rmsnorm.h"
#include "cuda/row_invariant_linear.h"
#include "cuda/row_invariant_mma.h"
#include "cuda/swiglu.h"
#include "cuda_case.h"
#include "ops/linear.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;
using bf16 = __nv_bfloat16;

constexpr int64_t kMaxRows = 33;

// Inputs for up to kMaxRows rows: a product of M rows reads the first M of inp and out0.
struct Product {
  int64_t C, OC;
  std::vector<float> inp, weight, bias, out0;
};

std::shared_ptr<const Product> make_product(int64_t C, int64_t OC, uint64_t seed) {
  auto p = std::make_shared<Product>();
  *p = {C, OC, randn(kMaxRows * C, seed), randn(OC * C, seed + 1, 0.1f), randn(OC, seed + 2),
        randn(kMaxRows * OC, seed + 3)};
  return p;
}

std::vector<float> first_rows(const std::vector<float>& v, int64_t rows, int64_t width) {
  return {v.begin(), v.begin() + rows * width};
}

// out = out0 + inp weight^T + bias on the dtype's inputs; bf16 also names the fp32-output product's.
Outputs cpu_product(const Product& p, int64_t M, DType t) {
  const auto x = to_dtype(first_rows(p.inp, M, p.C), t), w = to_dtype(p.weight, t), b = to_dtype(p.bias, t);
  const auto out0 = to_dtype(first_rows(p.out0, M, p.OC), t);
  std::vector<float> out(static_cast<size_t>(M * p.OC));
  jtok::linear_forward(out.data(), x.data(), w.data(), M, p.C, p.OC);
  for (int64_t n = 0; n < M; ++n)
    for (int64_t o = 0; o < p.OC; ++o) out[n * p.OC + o] += out0[n * p.OC + o] + b[o];
  if (t == DType::f32) return {{"out", out}};
  return {{"out", out}, {"out_f32", out}};
}

template <typename In, typename Out>
std::vector<float> gpu_product(const Product& p, int64_t M) {
  auto x = upload<In>(first_rows(p.inp, M, p.C)), w = upload<In>(p.weight);
  auto b = upload<Out>(to_dtype(p.bias, sizeof(In) == 2 ? DType::bf16 : DType::f32));
  auto out = upload<Out>(to_dtype(first_rows(p.out0, M, p.OC), sizeof(In) == 2 ? DType::bf16 : DType::f32));
  jtok::cuda::row_invariant_linear<In, Out>(out.get(), x.get(), w.get(), b.get(), M, p.C, p.OC, true, nullptr);
  return download(out);
}

Outputs gpu_outputs(const Product& p, int64_t M, DType t) {
  if (t == DType::f32) return {{"out", gpu_product<float, float>(p, M)}};
  return {{"out", gpu_product<bf16, bf16>(p, M)}, {"out_f32", gpu_product<bf16, float>(p, M)}};
}

struct Shape {
  const char* name;
  int64_t C, OC;
};

class CudaRowInvariantShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(CudaRowInvariantShapes, MatchesCpuLinear) {
  const Shape s = GetParam();
  const auto p = make_product(s.C, s.OC, 60 + static_cast<uint64_t>(s.C + s.OC));
  // The LM head's 155M weights cost seconds of host work a product: two row counts there.
  const std::vector<int64_t> rows = s.OC > 100000 ? std::vector<int64_t>{1, 16} : std::vector<int64_t>{1, 3, 16, 33};
  for (int64_t M : rows) {
    CudaCase c{"row_invariant_linear",
               std::string(s.name) + " M " + std::to_string(M) + " C " + std::to_string(s.C) + " OC " +
                   std::to_string(s.OC),
               {1e-6, 5e-3}};
    c.cpu = [p, M](DType t) { return cpu_product(*p, M, t); };
    c.gpu = [p, M](DType t) { return gpu_outputs(*p, M, t); };
    run_case(c);
    // The fp32 output of bf16 inputs: the fp32 bound (run_case held it to bf16's).
    const Outputs want = cpu_product(*p, M, DType::bf16), got = gpu_outputs(*p, M, DType::bf16);
    EXPECT_LE(jtok::testing::rel_err(got[1].second, want[1].second), 1e-6) << s.name << " M " << M << " (bf16, fp32)";
  }
}

INSTANTIATE_TEST_SUITE_P(Qwen3, CudaRowInvariantShapes,
                         ::testing::Values(Shape{"q", 1024, 2048}, Shape{"k_v", 1024, 1024},
                                           Shape{"gate_up", 1024, 3072}, Shape{"o", 2048, 1024},
                                           Shape{"down", 3072, 1024}, Shape{"lm_head", 1024, 151936},
                                           Shape{"odd", 333, 70}),
                         [](const ::testing::TestParamInfo<Shape>& i) { return std::string(i.param.name); });

// Row r of an M-row product against row r alone (M = 1), read from a fresh buffer at `offset`
// elements past its (256-byte aligned) start: 0 aligned, 1 off alignment.
template <typename In, typename Out>
void expect_rows_alone(const Product& p, int64_t M, int64_t offset) {
  const DType t = sizeof(In) == 2 ? DType::bf16 : DType::f32;
  auto x = upload<In>(first_rows(p.inp, M, p.C)), w = upload<In>(p.weight);
  auto b = upload<Out>(to_dtype(p.bias, t));
  auto batch = upload<Out>(to_dtype(first_rows(p.out0, M, p.OC), t));
  jtok::cuda::row_invariant_linear<In, Out>(batch.get(), x.get(), w.get(), b.get(), M, p.C, p.OC, true, nullptr);
  const std::vector<float> together = download(batch);
  for (int64_t r = 0; r < M; ++r) {
    std::vector<float> row(static_cast<size_t>(offset), 0.0f), out0(static_cast<size_t>(offset), 0.0f);
    row.insert(row.end(), p.inp.begin() + r * p.C, p.inp.begin() + (r + 1) * p.C);
    out0.insert(out0.end(), p.out0.begin() + r * p.OC, p.out0.begin() + (r + 1) * p.OC);
    auto xr = upload<In>(row);
    auto yr = upload<Out>(to_dtype(out0, t));
    jtok::cuda::row_invariant_linear<In, Out>(yr.get() + offset, xr.get() + offset, w.get(), b.get(), 1, p.C, p.OC,
                                              true, nullptr);
    const std::vector<float> alone = download(yr);
    ASSERT_EQ(0, std::memcmp(alone.data() + offset, together.data() + r * p.OC, static_cast<size_t>(p.OC) * 4))
        << "row " << r << " of " << M << " (C " << p.C << ", OC " << p.OC << ", offset " << offset << ", "
        << dtype_name(t) << " in, " << (sizeof(Out) == 4 ? "fp32" : "bf16") << " out) differs from itself alone";
  }
}

TEST(CudaRowInvariant, EachRowHasItsBitsAlone) {
  for (const auto& [C, OC] : {std::pair<int64_t, int64_t>{333, 70}, {1024, 96}, {3072, 40}}) {
    const auto p = make_product(C, OC, 90 + static_cast<uint64_t>(C));
    for (int64_t M : {2, 5, 16, 33}) {
      for (int64_t offset : {0, 1}) {
        expect_rows_alone<float, float>(*p, M, offset);
        expect_rows_alone<bf16, bf16>(*p, M, offset);
        expect_rows_alone<bf16, float>(*p, M, offset);
      }
    }
  }
}

// Through linear_forward: the Matmul's setting routes products of up to its rows to the kernel.
TEST(CudaRowInvariant, LinearForwardTakesItUnderTheSetting) {
  const auto p = make_product(1024, 512, 7);
  const int64_t M = 5;
  auto x = upload<bf16>(first_rows(p->inp, M, p->C)), w = upload<bf16>(p->weight);
  auto b = upload<float>(to_dtype(p->bias, DType::bf16));
  DeviceBuffer<float> via_linear(static_cast<size_t>(M * p->OC)), direct(static_cast<size_t>(M * p->OC));
  jtok::cuda::Matmul mm;
  EXPECT_EQ(mm.row_invariant_rows(), 0);
  {
    const jtok::cuda::RowInvariantProducts scope(mm, 8);
    EXPECT_EQ(mm.row_invariant_rows(), 8);
    jtok::cuda::linear_forward<bf16, float>(mm, via_linear.get(), x.get(), w.get(), b.get(), M, p->C, p->OC, false,
                                            nullptr);
  }
  EXPECT_EQ(mm.row_invariant_rows(), 0);
  EXPECT_EQ(mm.cached_plans(), 0u) << "a product under the setting made a cuBLASLt plan";
  jtok::cuda::row_invariant_linear<bf16, float>(direct.get(), x.get(), w.get(), b.get(), M, p->C, p->OC, false,
                                                nullptr);
  const std::vector<float> a = download(via_linear), d = download(direct);
  EXPECT_EQ(0, std::memcmp(a.data(), d.data(), a.size() * 4));
}

// row_invariant_swiglu's bits are row_invariant_linear's gate | up product (OC = 2F) followed by
// swiglu_forward, at every row count of a pass (M 1, 2, 3, 5, 9, 17), C on the 16-byte path (1024)
// and off it (300), F odd (the last block's second column past F).
template <typename T>
void expect_swiglu_bits(int64_t C, int64_t F) {
  const auto p = make_product(C, 2 * F, 11 + static_cast<uint64_t>(C));
  for (const int64_t M : {1, 2, 3, 5, 9, 17}) {
    auto x = upload<T>(first_rows(p->inp, M, C)), w = upload<T>(p->weight);
    DeviceBuffer<T> gate_up(static_cast<size_t>(M * 2 * F)), act(static_cast<size_t>(M * F)),
        fused(static_cast<size_t>(M * F));
    jtok::cuda::row_invariant_linear<T, T>(gate_up.get(), x.get(), w.get(), nullptr, M, C, 2 * F, false, nullptr);
    jtok::cuda::swiglu_forward<T>(act.get(), gate_up.get(), gate_up.get() + F, M, F, 2 * F, nullptr);
    jtok::cuda::row_invariant_swiglu<T>(fused.get(), x.get(), w.get(), M, C, F, nullptr);
    const std::vector<float> a = download(act), b = download(fused);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "M " << M << " C " << C << " F " << F;
  }
}

TEST(CudaRowInvariant, SwigluIsTheProductThenSwiglu) {
  expect_swiglu_bits<float>(1024, 37);
  expect_swiglu_bits<float>(300, 37);
  expect_swiglu_bits<bf16>(1024, 37);
  expect_swiglu_bits<bf16>(300, 64);
}

// A product with a norm against rmsnorm_forward then the plain product, bit for bit: linear (bias,
// accumulate) for each (In, Out) and SwiGLU, M 1, 3, 5, 16, 33, C on the 16-byte path (1024) and off
// it (300; and 1024 with the input and gain one element off alignment: the element-wise loads).
constexpr float kEps = 1e-6f;

template <typename In, typename Out>
void expect_normed_bits(int64_t C, int64_t OC, int64_t offset, bool swiglu) {
  const DType t = sizeof(In) == 2 ? DType::bf16 : DType::f32;
  const auto p = make_product(C, OC, 21 + static_cast<uint64_t>(C + offset));
  std::vector<float> gain_h(static_cast<size_t>(offset), 0.0f);
  const std::vector<float> g = randn(C, 5);
  gain_h.insert(gain_h.end(), g.begin(), g.end());
  auto gain = upload<In>(gain_h), w = upload<In>(p->weight);
  auto b = upload<Out>(to_dtype(p->bias, t));
  for (const int64_t M : {1, 3, 5, 16, 33}) {
    std::vector<float> x_h(static_cast<size_t>(offset), 0.0f);
    const std::vector<float> rows = first_rows(p->inp, M, C);
    x_h.insert(x_h.end(), rows.begin(), rows.end());
    auto x = upload<In>(x_h);
    DeviceBuffer<In> normed(static_cast<size_t>(M * C));
    DeviceBuffer<float> rstd(static_cast<size_t>(M));
    jtok::cuda::rmsnorm_forward<In>(normed.get(), rstd.get(), x.get() + offset, gain.get() + offset, M, C, kEps,
                                    nullptr);
    const int64_t width = swiglu ? OC / 2 : OC;
    auto plain = upload<Out>(to_dtype(first_rows(p->out0, M, width), t));
    auto fused = upload<Out>(to_dtype(first_rows(p->out0, M, width), t));
    const jtok::cuda::RowNorm<In> norm{gain.get() + offset, kEps};
    if constexpr (std::is_same_v<In, Out>) {
      if (swiglu) {
        jtok::cuda::row_invariant_swiglu<In>(plain.get(), normed.get(), w.get(), M, C, width, nullptr);
        jtok::cuda::row_invariant_swiglu<In>(fused.get(), x.get() + offset, w.get(), M, C, width, nullptr, norm);
      }
    }
    if (!swiglu) {
      jtok::cuda::row_invariant_linear<In, Out>(plain.get(), normed.get(), w.get(), b.get(), M, C, OC, true, nullptr);
      jtok::cuda::row_invariant_linear<In, Out>(fused.get(), x.get() + offset, w.get(), b.get(), M, C, OC, true,
                                                nullptr, norm);
    }
    const std::vector<float> a = download(plain), f = download(fused);
    ASSERT_EQ(0, std::memcmp(a.data(), f.data(), a.size() * sizeof(float)))
        << (swiglu ? "swiglu" : "linear") << " M " << M << " C " << C << " OC " << OC << " offset " << offset << ", "
        << dtype_name(t) << " in, " << (sizeof(Out) == 4 ? "fp32" : "bf16") << " out";
  }
}

TEST(CudaRowInvariant, NormedIsTheNormThenTheProduct) {
  for (const auto& [C, offset] : {std::pair<int64_t, int64_t>{1024, 0}, {300, 0}, {1024, 1}}) {
    for (const bool swiglu : {false, true}) {
      expect_normed_bits<float, float>(C, 74, offset, swiglu);
      expect_normed_bits<bf16, bf16>(C, 74, offset, swiglu);
    }
    expect_normed_bits<bf16, float>(C, 70, offset, false);
  }
}

// A side product in the same launch (row_invariant_linear_and_side: JTok-M's router beside q | k | v in
// the decoder) gives each product the bits of its own call: the main one's with bias and accumulate,
// the side's fp32 (OC 5, as the router's n_e: 2 blocks, the second with one column), normed and not,
// C on the 16-byte path (1024) and off it (300), M 1 to 16; a side weight one element off alignment
// takes the element-by-element loads for both, the same bits.
template <typename T>
void expect_side_bits(int64_t C, bool normed, int64_t side_offset) {
  const DType t = sizeof(T) == 2 ? DType::bf16 : DType::f32;
  const auto p = make_product(C, 74, 31 + static_cast<uint64_t>(C)), s = make_product(C, 5, 41);
  std::vector<float> side_h(static_cast<size_t>(side_offset), 0.0f);
  side_h.insert(side_h.end(), s->weight.begin(), s->weight.end());
  auto gain = upload<T>(randn(C, 6)), w = upload<T>(p->weight), sw = upload<T>(side_h);
  auto b = upload<T>(to_dtype(p->bias, t));
  const jtok::cuda::RowNorm<T> norm{normed ? gain.get() : nullptr, kEps};
  for (const int64_t M : {1, 2, 3, 16}) {
    auto x = upload<T>(first_rows(p->inp, M, C));
    auto main_alone = upload<T>(to_dtype(first_rows(p->out0, M, 74), t));
    auto main_fused = upload<T>(to_dtype(first_rows(p->out0, M, 74), t));
    DeviceBuffer<float> side_alone(static_cast<size_t>(M * 5)), side_fused(static_cast<size_t>(M * 5));
    jtok::cuda::row_invariant_linear<T, T>(main_alone.get(), x.get(), w.get(), b.get(), M, C, 74, true, nullptr, norm);
    jtok::cuda::row_invariant_linear<T, float>(side_alone.get(), x.get(), sw.get() + side_offset, nullptr, M, C, 5,
                                               false, nullptr, norm);
    jtok::cuda::row_invariant_linear_and_side<T, T>(main_fused.get(), x.get(), w.get(), b.get(), M, C, 74, true,
                                                    side_fused.get(), sw.get() + side_offset, 5, nullptr, norm);
    const std::string at = std::string(dtype_name(t)) + " M " + std::to_string(M) + " C " + std::to_string(C) +
                           (normed ? " normed" : "") + " side offset " + std::to_string(side_offset);
    const std::vector<float> a = download(main_alone), f = download(main_fused);
    EXPECT_EQ(0, std::memcmp(a.data(), f.data(), a.size() * sizeof(float))) << "main product, " << at;
    const std::vector<float> sa = download(side_alone), sf = download(side_fused);
    EXPECT_EQ(0, std::memcmp(sa.data(), sf.data(), sa.size() * sizeof(float))) << "side product, " << at;
  }
}

TEST(CudaRowInvariant, ASideProductHasItsOwnBits) {
  for (const int64_t C : {1024, 300})
    for (const bool normed : {false, true}) {
      expect_side_bits<float>(C, normed, 0);
      expect_side_bits<bf16>(C, normed, 0);
    }
  expect_side_bits<bf16>(1024, true, 1);
  float out = 0;
  const auto no_side_output = [&] {
    jtok::cuda::row_invariant_linear_and_side<float, float>(&out, &out, &out, nullptr, 1, 1, 1, false, nullptr, &out, 1,
                                                            nullptr);
  };
  EXPECT_THROW(no_side_output(), jtok::Error);
}

// The grouped products over 5 experts whose rows are 3, 0, 1, 6, 2 (one without rows: the list
// holds the other 4; the launch has room for 4, or for 5 with the last block exiting), each
// expert's weight 3 (OC, C) blocks apart as MoE's gate, up, down: every row's bits equal the plain
// kernel's over its expert's rows alone, with max_rows 6 (groups of 8 rows: one pass an expert) and
// 2 (groups of 2: several); C on the 16-byte path (1024) and off it (300), OC not a multiple of 4;
// SwiGLU with F odd.
template <typename T>
void expect_grouped_bits(int64_t C, int64_t OC, int64_t max_rows, int64_t max_experts) {
  const std::vector<int32_t> offsets = {0, 3, 3, 4, 10, 12};
  const int64_t E = 5, rows = offsets.back(), stride = 3 * OC * C;
  const std::vector<float> weights = randn(E * stride, 41, 0.1f), inp = randn(rows * C, 42);
  auto x = upload<T>(inp), w = upload<T>(weights);
  auto off = upload_exact(offsets), with_rows = upload_exact(std::vector<int32_t>{0, 2, 3, 4}),
       count = upload_exact(std::vector<int32_t>{4});
  const jtok::cuda::ExpertRows groups{off.get(), with_rows.get(), count.get(), max_experts, max_rows, stride};
  const int64_t F = OC / 2;  // SwiGLU: each expert's first OC rows are its gate | up (2F, C)
  DeviceBuffer<T> grouped(static_cast<size_t>(rows * OC)), swiglu(static_cast<size_t>(rows * F));
  jtok::cuda::row_invariant_expert_linear<T, T>(grouped.get(), x.get(), w.get(), groups, C, OC, nullptr);
  jtok::cuda::row_invariant_expert_swiglu<T>(swiglu.get(), x.get(), w.get(), groups, C, F, nullptr);
  const std::vector<float> g = download(grouped), s = download(swiglu);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offsets[static_cast<size_t>(e)], n = offsets[static_cast<size_t>(e) + 1] - r0;
    if (n == 0) continue;
    DeviceBuffer<T> alone(static_cast<size_t>(n * OC)), alone_swiglu(static_cast<size_t>(n * F));
    jtok::cuda::row_invariant_linear<T, T>(alone.get(), x.get() + r0 * C, w.get() + e * stride, nullptr, n, C, OC,
                                           false, nullptr);
    jtok::cuda::row_invariant_swiglu<T>(alone_swiglu.get(), x.get() + r0 * C, w.get() + e * stride, n, C, F, nullptr);
    const std::vector<float> a = download(alone), b = download(alone_swiglu);
    EXPECT_EQ(0, std::memcmp(a.data(), g.data() + r0 * OC, a.size() * sizeof(float)))
        << "expert " << e << " C " << C << " OC " << OC << " max_rows " << max_rows
        << ": grouped rows differ from the expert's alone";
    EXPECT_EQ(0, std::memcmp(b.data(), s.data() + r0 * F, b.size() * sizeof(float)))
        << "expert " << e << " C " << C << " F " << F << " max_rows " << max_rows
        << ": grouped SwiGLU rows differ from the expert's alone";
  }
}

TEST(CudaRowInvariant, GroupedExpertsHaveEachExpertsBits) {
  for (const int64_t max_rows : {6, 2}) {
    expect_grouped_bits<float>(1024, 74, max_rows, 4);
    expect_grouped_bits<float>(300, 74, max_rows, 5);
    expect_grouped_bits<bf16>(1024, 74, max_rows, 5);
    expect_grouped_bits<bf16>(300, 74, max_rows, 4);
  }
}

// The tensor-core twin's product of the rows x (M, C) onto out0 (M, OC), bias and accumulate on.
template <typename Out>
std::vector<float> mma_product(const Product& p, const std::vector<float>& x, const std::vector<float>& out0,
                               int64_t M) {
  auto dx = upload<bf16>(x), w = upload<bf16>(p.weight);
  auto b = upload<Out>(to_dtype(p.bias, DType::bf16));
  auto out = upload<Out>(to_dtype(out0, DType::bf16));
  jtok::cuda::row_invariant_linear_mma<Out>(out.get(), dx.get(), w.get(), b.get(), M, p.C, p.OC, true, nullptr);
  return download(out);
}

TEST(CudaRowInvariantMma, MatchesCpuLinear) {
  for (const auto& [C, OC] : {std::pair<int64_t, int64_t>{1024, 2048}, {2048, 1024}, {3072, 1024}, {336, 70}}) {
    const auto p = make_product(C, OC, 70 + static_cast<uint64_t>(C + OC));
    for (int64_t M : {1, 3, 16, 33}) {
      const Outputs want = cpu_product(*p, M, DType::bf16);
      const auto x = first_rows(p->inp, M, C), out0 = first_rows(p->out0, M, OC);
      const std::string at = "C " + std::to_string(C) + " OC " + std::to_string(OC) + " M " + std::to_string(M);
      EXPECT_LE(jtok::testing::rel_err(mma_product<bf16>(*p, x, out0, M), want[0].second), 5e-3) << at << " bf16 out";
      EXPECT_LE(jtok::testing::rel_err(mma_product<float>(*p, x, out0, M), want[1].second), 1e-5) << at << " fp32 out";
    }
  }
}

template <typename Out>
void expect_mma_rows_alone(const Product& p, int64_t M) {
  const std::vector<float> together = mma_product<Out>(p, first_rows(p.inp, M, p.C), first_rows(p.out0, M, p.OC), M);
  for (int64_t r = 0; r < M; ++r) {
    const std::vector<float> x(p.inp.begin() + r * p.C, p.inp.begin() + (r + 1) * p.C),
        out0(p.out0.begin() + r * p.OC, p.out0.begin() + (r + 1) * p.OC);
    const std::vector<float> alone = mma_product<Out>(p, x, out0, 1);
    ASSERT_EQ(0, std::memcmp(alone.data(), together.data() + r * p.OC, static_cast<size_t>(p.OC) * 4))
        << "row " << r << " of " << M << " (C " << p.C << ", OC " << p.OC << ", "
        << (sizeof(Out) == 4 ? "fp32" : "bf16") << " out) differs from itself alone";
  }
}

TEST(CudaRowInvariantMma, EachRowHasItsBitsAlone) {
  for (const auto& [C, OC] : {std::pair<int64_t, int64_t>{336, 70}, {1024, 96}, {3072, 40}}) {
    const auto p = make_product(C, OC, 95 + static_cast<uint64_t>(C));
    for (int64_t M : {2, 5, 16, 33}) {
      expect_mma_rows_alone<bf16>(*p, M);
      expect_mma_rows_alone<float>(*p, M);
    }
  }
}

// row_invariant_swiglu_mma: row_invariant_linear_mma's gate | up (2F columns, bf16) then swiglu_forward,
// bit for bit, at M 1, 2, 3, 5, 9, 17; F 37 (the last block's columns past F) and 64; C 1024 and 336.
TEST(CudaRowInvariantMma, SwigluIsTheProductThenSwiglu) {
  for (const auto& [C, F] : {std::pair<int64_t, int64_t>{1024, 37}, {336, 64}}) {
    const auto p = make_product(C, 2 * F, 13 + static_cast<uint64_t>(C));
    auto w = upload<bf16>(p->weight);
    for (const int64_t M : {1, 2, 3, 5, 9, 17}) {
      auto x = upload<bf16>(first_rows(p->inp, M, C));
      DeviceBuffer<bf16> gate_up(static_cast<size_t>(M * 2 * F)), act(static_cast<size_t>(M * F)),
          fused(static_cast<size_t>(M * F));
      jtok::cuda::row_invariant_linear_mma<bf16>(gate_up.get(), x.get(), w.get(), nullptr, M, C, 2 * F, false, nullptr);
      jtok::cuda::swiglu_forward<bf16>(act.get(), gate_up.get(), gate_up.get() + F, M, F, 2 * F, nullptr);
      jtok::cuda::row_invariant_swiglu_mma(fused.get(), x.get(), w.get(), M, C, F, nullptr);
      const std::vector<float> a = download(act), b = download(fused);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "M " << M << " C " << C << " F " << F;
    }
  }
}

// With a norm: rmsnorm_forward then the plain product (linear with bias and accumulate, bf16 and fp32
// out; SwiGLU), bit for bit, M 1, 3, 5, 16, 33, C 1024 and 336.
template <typename Out>
void expect_mma_normed_bits(int64_t C, int64_t OC, bool swiglu) {
  const auto p = make_product(C, OC, 23 + static_cast<uint64_t>(C));
  auto gain = upload<bf16>(randn(C, 5)), w = upload<bf16>(p->weight);
  auto b = upload<Out>(to_dtype(p->bias, DType::bf16));
  const int64_t width = swiglu ? OC / 2 : OC;
  for (const int64_t M : {1, 3, 5, 16, 33}) {
    auto x = upload<bf16>(first_rows(p->inp, M, C));
    DeviceBuffer<bf16> normed(static_cast<size_t>(M * C));
    DeviceBuffer<float> rstd(static_cast<size_t>(M));
    jtok::cuda::rmsnorm_forward<bf16>(normed.get(), rstd.get(), x.get(), gain.get(), M, C, kEps, nullptr);
    auto plain = upload<Out>(to_dtype(first_rows(p->out0, M, width), DType::bf16));
    auto fused = upload<Out>(to_dtype(first_rows(p->out0, M, width), DType::bf16));
    const jtok::cuda::RowNorm<bf16> norm{gain.get(), kEps};
    if constexpr (std::is_same_v<Out, bf16>) {
      if (swiglu) {
        jtok::cuda::row_invariant_swiglu_mma(plain.get(), normed.get(), w.get(), M, C, width, nullptr);
        jtok::cuda::row_invariant_swiglu_mma(fused.get(), x.get(), w.get(), M, C, width, nullptr, norm);
      }
    }
    if (!swiglu) {
      jtok::cuda::row_invariant_linear_mma<Out>(plain.get(), normed.get(), w.get(), b.get(), M, C, OC, true, nullptr);
      jtok::cuda::row_invariant_linear_mma<Out>(fused.get(), x.get(), w.get(), b.get(), M, C, OC, true, nullptr, norm);
    }
    const std::vector<float> a = download(plain), f = download(fused);
    ASSERT_EQ(0, std::memcmp(a.data(), f.data(), a.size() * sizeof(float)))
        << (swiglu ? "swiglu" : "linear") << " M " << M << " C " << C << " OC " << OC << ", "
        << (sizeof(Out) == 4 ? "fp32" : "bf16") << " out";
  }
}

TEST(CudaRowInvariantMma, NormedIsTheNormThenTheProduct) {
  for (const int64_t C : {1024, 336}) {
    expect_mma_normed_bits<bf16>(C, 74, false);
    expect_mma_normed_bits<bf16>(C, 74, true);
    expect_mma_normed_bits<float>(C, 70, false);
  }
}

TEST(CudaRowInvariantMma, RefusesWhatItCannotLoad) {
  auto x = upload<bf16>(std::vector<float>(2 * 336)), w = upload<bf16>(std::vector<float>(8 * 336));
  auto out = upload<bf16>(std::vector<float>(2 * 8));
  EXPECT_THROW(
      jtok::cuda::row_invariant_linear_mma<bf16>(out.get(), x.get(), w.get(), nullptr, 1, 333, 8, false, nullptr),
      jtok::Error);  // C not a multiple of 8
  EXPECT_THROW(
      jtok::cuda::row_invariant_linear_mma<bf16>(out.get(), x.get() + 1, w.get(), nullptr, 1, 328, 8, false, nullptr),
      jtok::Error);  // the input off 16-byte alignment
}

}  // namespace
