// The row-invariant products of int8 weights (src/cuda/row_invariant_linear.h's
// row_invariant_linear_q8 / row_invariant_swiglu_q8: the GPU decoder's decode steps on a `jtok export
// --weight-dtype int8` checkpoint), weights quantised by the CPU's quantize_int8_rows:
// - fp32 inputs: bit for bit the fp32 kernel on the matrix dequantize_rows makes (the CPU's q * scale),
//   plain (bias, accumulate) and with the norm inside, and SwiGLU; M 1, 3, 16, 33; C on the vector
//   loads (1024, 300) and off them (the weights one byte off alignment: byte by byte).
// - bf16 inputs: against the CPU's linear_forward of the bf16-rounded inputs and the dequantised fp32
//   matrix (the weights are not rounded to bf16): fp32 outputs within 1e-6 (sums in other orders),
//   bf16 outputs within 5e-3 (the output rounded once); and each row of M = 5, 16 equals itself
//   computed alone, bit for bit.
// - MoE's grouped experts (row_invariant_expert_linear_q8 / _swiglu_q8, an int8 export's decode
//   step): fp32, bit for bit the grouped fp32 kernels on the dequantised experts; bf16, each expert's
//   rows bit for bit the plain int8 kernel over that expert's rows and matrix alone.
// `--gtest_filter='CudaRowInvariantQ8.*'`; a GPU host only (in test_cuda_ops).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/row_invariant_linear.h"
#include "cuda_case.h"
#include "ops/linear.h"
#include "ops/lowp_convert.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;
using bf16 = __nv_bfloat16;

// An int8 matrix (OC, C) as the export writes it, its dequantised fp32 twin, and its device copy
// `offset` bytes past an aligned start (1: the byte-by-byte loads).
struct Q8Matrix {
  int64_t OC = 0, C = 0;
  std::vector<int8_t> q;
  std::vector<float> scale, dequantised;
  DeviceBuffer<int8_t> q_dev{0};
  DeviceBuffer<float> scale_dev{0};
  jtok::cuda::Q8Weight weight(int64_t offset) const { return {q_dev.get() + offset, scale_dev.get()}; }
};

Q8Matrix make_q8(int64_t OC, int64_t C, uint64_t seed, int64_t offset) {
  const std::vector<float> w = randn(OC * C, seed, 0.1f);
  std::vector<int8_t> q(static_cast<size_t>(OC * C));
  std::vector<float> scale(static_cast<size_t>(OC)), dequantised(w.size());
  jtok::quantize_int8_rows(q.data(), scale.data(), w.data(), OC, C);
  jtok::dequantize_rows(dequantised.data(), {jtok::Dtype::int8, q.data(), scale.data(), OC, C}, 0, OC);
  std::vector<int8_t> shifted(static_cast<size_t>(offset), 0);
  shifted.insert(shifted.end(), q.begin(), q.end());
  return {OC, C, q, scale, dequantised, upload_exact(shifted), upload_exact(scale)};
}

constexpr float kEps = 1e-6f;

// fp32: the int8 kernel against the fp32 kernel on the dequantised matrix, memcmp, for a linear
// product (bias, accumulate; with the norm and without) and SwiGLU (OC = 2F).
void expect_fp32_bits(int64_t C, int64_t OC, int64_t offset) {
  const Q8Matrix m = make_q8(OC, C, 70 + static_cast<uint64_t>(C + offset), offset);
  auto w = upload<float>(m.dequantised), gain = upload<float>(randn(C, 71)), bias = upload<float>(randn(OC, 72));
  for (const int64_t M : {1, 3, 16, 33}) {
    auto x = upload<float>(randn(M * C, 73));
    const std::vector<float> out0 = randn(M * OC, 74);
    for (const bool normed : {false, true}) {
      const jtok::cuda::RowNorm<float> norm{normed ? gain.get() : nullptr, kEps};
      auto plain = upload<float>(out0), q8 = upload<float>(out0);
      jtok::cuda::row_invariant_linear<float, float>(plain.get(), x.get(), w.get(), bias.get(), M, C, OC, true, nullptr,
                                                     norm);
      jtok::cuda::row_invariant_linear_q8<float, float>(q8.get(), x.get(), m.weight(offset), bias.get(), M, C, OC, true,
                                                        nullptr, norm);
      const std::vector<float> a = download(plain), b = download(q8);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
          << "linear M " << M << " C " << C << " OC " << OC << " offset " << offset << " normed " << normed;
      const int64_t F = OC / 2;
      DeviceBuffer<float> sw_plain(static_cast<size_t>(M * F)), sw_q8(static_cast<size_t>(M * F));
      jtok::cuda::row_invariant_swiglu<float>(sw_plain.get(), x.get(), w.get(), M, C, F, nullptr, norm);
      jtok::cuda::row_invariant_swiglu_q8<float>(sw_q8.get(), x.get(), m.weight(offset), M, C, F, nullptr, norm);
      const std::vector<float> c = download(sw_plain), d = download(sw_q8);
      ASSERT_EQ(0, std::memcmp(c.data(), d.data(), c.size() * 4))
          << "swiglu M " << M << " C " << C << " F " << F << " offset " << offset << " normed " << normed;
    }
  }
}

TEST(CudaRowInvariantQ8, Fp32IsTheDequantisedProduct) {
  expect_fp32_bits(1024, 74, 0);
  expect_fp32_bits(300, 74, 0);
  expect_fp32_bits(1024, 70, 1);
}

// bf16 inputs, int8 weights: the CPU's product of the rounded inputs and the dequantised matrix.
void expect_bf16_near_cpu(int64_t C, int64_t OC, int64_t offset) {
  const Q8Matrix m = make_q8(OC, C, 80 + static_cast<uint64_t>(C), offset);
  for (const int64_t M : {1, 3, 16, 33}) {
    const std::vector<float> x = to_dtype(randn(M * C, 81), DType::bf16);
    std::vector<float> want(static_cast<size_t>(M * OC));
    jtok::linear_forward(want.data(), x.data(), m.dequantised.data(), M, C, OC);
    auto xd = upload<bf16>(x);
    DeviceBuffer<float> out_f32(want.size());
    DeviceBuffer<bf16> out_bf16(want.size());
    jtok::cuda::row_invariant_linear_q8<bf16, float>(out_f32.get(), xd.get(), m.weight(offset), nullptr, M, C, OC,
                                                     false, nullptr);
    jtok::cuda::row_invariant_linear_q8<bf16, bf16>(out_bf16.get(), xd.get(), m.weight(offset), nullptr, M, C, OC,
                                                    false, nullptr);
    const std::string at = "M " + std::to_string(M) + " C " + std::to_string(C) + " offset " + std::to_string(offset);
    EXPECT_LE(jtok::testing::rel_err(download(out_f32), want), 1e-6) << "(bf16, fp32) " << at;
    EXPECT_LE(jtok::testing::rel_err(download(out_bf16), want), 5e-3) << "(bf16, bf16) " << at;
  }
}

TEST(CudaRowInvariantQ8, Bf16MatchesCpu) {
  expect_bf16_near_cpu(1024, 2048, 0);
  expect_bf16_near_cpu(3072, 1024, 0);
  expect_bf16_near_cpu(336, 70, 1);
}

// Each row of an M-row product of bf16 inputs equals the same row alone, bit for bit.
TEST(CudaRowInvariantQ8, EachRowHasItsBitsAlone) {
  const int64_t C = 1024, OC = 74;
  const Q8Matrix m = make_q8(OC, C, 90, 0);
  for (const int64_t M : {5, 16}) {
    const std::vector<float> x = randn(M * C, 91);
    auto xd = upload<bf16>(x);
    DeviceBuffer<bf16> together(static_cast<size_t>(M * OC));
    jtok::cuda::row_invariant_linear_q8<bf16, bf16>(together.get(), xd.get(), m.weight(0), nullptr, M, C, OC, false,
                                                    nullptr);
    const std::vector<float> all = download(together);
    for (int64_t r = 0; r < M; ++r) {
      auto xr = upload<bf16>(std::vector<float>(x.begin() + r * C, x.begin() + (r + 1) * C));
      DeviceBuffer<bf16> alone(static_cast<size_t>(OC));
      jtok::cuda::row_invariant_linear_q8<bf16, bf16>(alone.get(), xr.get(), m.weight(0), nullptr, 1, C, OC, false,
                                                      nullptr);
      const std::vector<float> one = download(alone);
      ASSERT_EQ(0, std::memcmp(one.data(), all.data() + r * OC, one.size() * 4)) << "row " << r << " of " << M;
    }
  }
}

// 5 experts whose rows are 3, 0, 1, 6, 2 (the one without rows not listed), each 3 (OC, C) int8
// blocks apart with its rows' scales 3 OC apart (gate | up, down as the decoder packs them): the
// grouped int8 products against, in fp32, the grouped fp32 products of the dequantised experts and,
// in bf16, the plain int8 product of each expert's rows alone. max_rows 6 and 2 (one pass an expert,
// several); C on the vector loads (1024), off them (300), and the weights a byte off alignment.
template <typename T>
void expect_grouped_q8(int64_t C, int64_t OC, int64_t max_rows, int64_t offset) {
  const std::vector<int32_t> offsets = {0, 3, 3, 4, 10, 12};
  const int64_t E = 5, rows = offsets.back(), F = OC / 2;
  const Q8Matrix m = make_q8(E * 3 * OC, C, 100 + static_cast<uint64_t>(C + offset), offset);
  auto x = upload<T>(randn(rows * C, 101));
  auto off = upload_exact(offsets), with_rows = upload_exact(std::vector<int32_t>{0, 2, 3, 4}),
       count = upload_exact(std::vector<int32_t>{4});
  jtok::cuda::ExpertRows groups{off.get(), with_rows.get(), count.get(), 4, max_rows, 3 * OC * C};
  groups.scale_stride = 3 * OC;
  DeviceBuffer<T> linear(static_cast<size_t>(rows * OC)), swiglu(static_cast<size_t>(rows * F));
  jtok::cuda::row_invariant_expert_linear_q8<T>(linear.get(), x.get(), m.weight(offset), groups, C, OC, nullptr);
  jtok::cuda::row_invariant_expert_swiglu_q8<T>(swiglu.get(), x.get(), m.weight(offset), groups, C, F, nullptr);
  const std::vector<float> got = download(linear), got_swiglu = download(swiglu);
  const std::string at = " C " + std::to_string(C) + " OC " + std::to_string(OC) + " max_rows " +
                         std::to_string(max_rows) + " offset " + std::to_string(offset);
  if constexpr (std::is_same_v<T, float>) {
    auto w = upload<float>(m.dequantised);
    DeviceBuffer<float> want(got.size()), want_swiglu(got_swiglu.size());
    jtok::cuda::row_invariant_expert_linear<float, float>(want.get(), x.get(), w.get(), groups, C, OC, nullptr);
    jtok::cuda::row_invariant_expert_swiglu<float>(want_swiglu.get(), x.get(), w.get(), groups, C, F, nullptr);
    EXPECT_EQ(0, std::memcmp(download(want).data(), got.data(), got.size() * 4)) << "fp32 linear" << at;
    EXPECT_EQ(0, std::memcmp(download(want_swiglu).data(), got_swiglu.data(), got_swiglu.size() * 4))
        << "fp32 swiglu" << at;
    return;
  }
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offsets[static_cast<size_t>(e)], n = offsets[static_cast<size_t>(e) + 1] - r0;
    if (n == 0) continue;
    const jtok::cuda::Q8Weight we{m.q_dev.get() + offset + e * 3 * OC * C, m.scale_dev.get() + e * 3 * OC};
    DeviceBuffer<T> alone(static_cast<size_t>(n * OC)), alone_swiglu(static_cast<size_t>(n * F));
    jtok::cuda::row_invariant_linear_q8<T, T>(alone.get(), x.get() + r0 * C, we, nullptr, n, C, OC, false, nullptr);
    jtok::cuda::row_invariant_swiglu_q8<T>(alone_swiglu.get(), x.get() + r0 * C, we, n, C, F, nullptr);
    const std::vector<float> a = download(alone), b = download(alone_swiglu);
    EXPECT_EQ(0, std::memcmp(a.data(), got.data() + r0 * OC, a.size() * 4)) << "bf16 linear, expert " << e << at;
    EXPECT_EQ(0, std::memcmp(b.data(), got_swiglu.data() + r0 * F, b.size() * 4)) << "bf16 swiglu, expert " << e << at;
  }
}

TEST(CudaRowInvariantQ8, GroupedExpertsAreTheDequantisedExperts) {
  for (const int64_t max_rows : {6, 2}) {
    expect_grouped_q8<float>(1024, 74, max_rows, 0);
    expect_grouped_q8<float>(300, 74, max_rows, 0);
    expect_grouped_q8<float>(1024, 70, max_rows, 1);
    expect_grouped_q8<bf16>(1024, 74, max_rows, 0);
    expect_grouped_q8<bf16>(336, 70, max_rows, 1);
  }
}

}  // namespace
