// cuBLASLt products (src/cuda/matmul.h) against the CPU engine's: the linear layer's forward and
// backward (ops/linear.h linear_forward / linear_backward, whose fp32 path is checked by finite
// differences in tests/test_ops.cpp) and the row-major gemm in all four transposes with row strides
// wider than the rows (jtok::gemm_f32), fp32 and bf16, through tests/cuda/cuda_case.h.
// Tolerances by normalised error: fp32 1e-5 (CUBLAS_COMPUTE_32F, no TF32: the order of the sums
// only); bf16 1e-2 (bf16 inputs on both sides, the GPU's bf16 outputs rounded once, 2^-9).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "cuda/cublaslt_api.h"
#include "cuda/gemm_ref.h"
#include "cuda/matmul.h"
#include "cuda_case.h"
#include "ops/linear.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

struct LinearInputs {
  int64_t N, C, OC;
  std::vector<float> inp, weight, bias, out0, dout, dinp0, dweight0;
};

std::shared_ptr<const LinearInputs> make_linear(int64_t N, int64_t C, int64_t OC, uint64_t seed) {
  auto in = std::make_shared<LinearInputs>();
  *in = {N, C, OC, randn(N * C, seed), randn(OC * C, seed + 1, 0.1f), randn(OC, seed + 2), randn(N * OC, seed + 3),
         randn(N * OC, seed + 4), randn(N * C, seed + 5), randn(OC * C, seed + 6)};
  return in;
}

// out = out0 + inp weight^T + bias (the CPU layer has no bias: added here); dinp = dinp0 + dout
// weight; dweight = dweight0 + dout^T inp; dinp_over = dout weight and dweight_over = dout^T inp (the
// GPU's written over NaN: add_to_dinp and add_to_dweight false, as the model's backward runs them,
// never reading them).
Outputs cpu_linear(const LinearInputs& in, DType t) {
  const auto x = to_dtype(in.inp, t), w = to_dtype(in.weight, t), dout = to_dtype(in.dout, t);
  const auto bias = to_dtype(in.bias, t), out0 = to_dtype(in.out0, t);
  std::vector<float> out(out0.size());
  jtok::linear_forward(out.data(), x.data(), w.data(), in.N, in.C, in.OC);
  for (int64_t n = 0; n < in.N; ++n)
    for (int64_t o = 0; o < in.OC; ++o) out[n * in.OC + o] += out0[n * in.OC + o] + bias[o];
  auto dinp = to_dtype(in.dinp0, t), dweight = to_dtype(in.dweight0, t);
  jtok::linear_backward(dinp.data(), dweight.data(), dout.data(), x.data(), w.data(), in.N, in.C, in.OC);
  std::vector<float> over(dinp.size(), 0.0f), unused(dweight.size(), 0.0f);
  jtok::linear_backward(over.data(), unused.data(), dout.data(), x.data(), w.data(), in.N, in.C, in.OC);
  return {{"out", out}, {"dinp", dinp}, {"dweight", dweight}, {"dinp_over", over}, {"dweight_over", unused}};
}

// E the activations' type; the weight gradient accumulates in fp32 (the master gradients).
template <typename E>
Outputs gpu_linear(const LinearInputs& in) {
  jtok::cuda::Matmul mm;
  auto x = upload<E>(in.inp), w = upload<E>(in.weight), dout = upload<E>(in.dout), bias = upload<E>(in.bias);
  auto out = upload<E>(in.out0), dinp = upload<E>(in.dinp0);
  auto dweight = upload<float>(to_dtype(in.dweight0, sizeof(E) == 2 ? DType::bf16 : DType::f32));
  jtok::cuda::linear_forward<E, E>(mm, out.get(), x.get(), w.get(), bias.get(), in.N, in.C, in.OC, true, nullptr);
  jtok::cuda::linear_backward<E, float>(mm, dinp.get(), dweight.get(), dout.get(), x.get(), w.get(), in.N, in.C, in.OC,
                                        nullptr);
  // The forward's shape again, into another buffer: served from the plan cache.
  const size_t plans = mm.cached_plans();
  DeviceBuffer<E> again(in.out0.size());
  jtok::cuda::linear_forward<E, E>(mm, again.get(), x.get(), w.get(), bias.get(), in.N, in.C, in.OC, false, nullptr);
  EXPECT_EQ(mm.cached_plans(), plans);
  DeviceBuffer<E> over(in.dinp0.size());
  DeviceBuffer<float> dweight_over(in.dweight0.size());
  JTOK_CUDA_CHECK(cudaMemset(over.get(), 0xff, over.n * sizeof(E)));  // NaN: never read
  JTOK_CUDA_CHECK(cudaMemset(dweight_over.get(), 0xff, dweight_over.n * sizeof(float)));
  jtok::cuda::linear_backward<E, float>(mm, over.get(), dweight_over.get(), dout.get(), x.get(), w.get(), in.N, in.C,
                                        in.OC, nullptr, false, false);
  return {{"out", download(out)},
          {"dinp", download(dinp)},
          {"dweight", download(dweight)},
          {"dinp_over", download(over)},
          {"dweight_over", download(dweight_over)}};
}

struct LinearShape {
  int64_t N, C, OC;
};

class CudaLinear : public ::testing::TestWithParam<LinearShape> {};

TEST_P(CudaLinear, MatchesCpuForwardAndBackward) {
  const auto [N, C, OC] = GetParam();
  const auto in = make_linear(N, C, OC, 40 + static_cast<uint64_t>(N + C + OC));
  CudaCase c{"linear fwd+bwd", "N " + std::to_string(N) + ", C " + std::to_string(C) + ", OC " + std::to_string(OC),
             {1e-5, 1e-2}};
  c.cpu = [in](DType t) { return cpu_linear(*in, t); };
  c.gpu = [in](DType t) { return t == DType::f32 ? gpu_linear<float>(*in) : gpu_linear<__nv_bfloat16>(*in); };
  run_case(c);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaLinear,
                         ::testing::Values(LinearShape{74, 96, 160}, LinearShape{1, 64, 48}, LinearShape{129, 384, 1152},
                                           LinearShape{33, 130, 7}));

// Row-major C (M,N) = alpha op(A) op(B) + beta C with row strides wider than the rows, all four
// transposes, against jtok::gemm_f32 on the same (dtype-rounded) operands.
struct GemmShape {
  bool ta, tb;
};

Outputs cpu_gemm(bool ta, bool tb, const std::vector<float>& a, const std::vector<float>& b,
                 const std::vector<float>& c0, DType t, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                 int64_t ldc) {
  auto c = to_dtype(c0, t);
  const auto a_t = to_dtype(a, t), b_t = to_dtype(b, t);
  jtok::gemm_f32(ta, tb, M, N, K, 0.5f, a_t.data(), lda, b_t.data(), ldb, 1.0f, c.data(), ldc);
  return {{"C", c}};
}

class CudaGemm : public ::testing::TestWithParam<GemmShape> {};

TEST_P(CudaGemm, RowMajorTransposesAndStrides) {
  const auto [ta, tb] = GetParam();
  const int64_t M = 37, N = 24, K = 53;
  const int64_t lda = (ta ? M : K) + 8, ldb = (tb ? K : N) + 8, ldc = N + 8;
  const auto a = randn((ta ? K : M) * lda, 1), b = randn((tb ? N : K) * ldb, 2), c0 = randn(M * ldc, 3);
  CudaCase c{"gemm", std::string("trans ") + (ta ? "T" : "N") + (tb ? "T" : "N") + ", M 37 N 24 K 53", {1e-5, 1e-2}};
  c.cpu = [=](DType t) { return cpu_gemm(ta, tb, a, b, c0, t, M, N, K, lda, ldb, ldc); };
  c.gpu = [=](DType t) {
    jtok::cuda::Matmul mm;
    if (t == DType::f32) {
      auto da = upload<float>(a), db = upload<float>(b), dc = upload<float>(c0);
      mm.gemm<float, float>(ta, tb, M, N, K, 0.5f, da.get(), lda, db.get(), ldb, 1.0f, dc.get(), ldc,
                            nullptr, nullptr);
      return Outputs{{"C", download(dc)}};
    }
    auto da = upload<__nv_bfloat16>(a), db = upload<__nv_bfloat16>(b);
    auto dc = upload<float>(to_dtype(c0, DType::bf16));
    mm.gemm<__nv_bfloat16, float>(ta, tb, M, N, K, 0.5f, da.get(), lda, db.get(), ldb, 1.0f, dc.get(), ldc,
                                  nullptr, nullptr);
    return Outputs{{"C", download(dc)}};
  };
  run_case(c);
}

INSTANTIATE_TEST_SUITE_P(Transposes, CudaGemm,
                         ::testing::Values(GemmShape{false, false}, GemmShape{false, true}, GemmShape{true, false},
                                           GemmShape{true, true}));

// gemm_lt (the GemmFn the fused ops take) against gemm_ref, the plain GPU product, on an LM-head
// shaped product (rows x vocab slice, C 96) in fp32: both sum in fp32, only the order differs.
TEST(CudaGemmBits, GemmLtMatchesGemmRef) {
  const int64_t M = 70, N = 500, K = 96;
  auto a = upload<float>(randn(M * K, 8)), b = upload<float>(randn(N * K, 9));
  DeviceBuffer<float> c_lt(M * N), c_ref(M * N);
  const jtok::cuda::GemmFn<float, float> lt = jtok::cuda::gemm_lt<float, float>;
  lt(false, true, M, N, K, 1.0f, a.get(), K, b.get(), K, 0.0f, c_lt.get(), N, nullptr);
  jtok::cuda::gemm_ref<float, float>(false, true, M, N, K, 1.0f, a.get(), K, b.get(), K, 0.0f, c_ref.get(), N, nullptr);
  EXPECT_LT(jtok::testing::rel_err(download(c_lt), download(c_ref)), 1e-5);
}

// Products of ever new row counts (MoE's experts): the plan cache stops at kMaxPlans and starts
// over, and a shape planned again gives the bits it gave before.
TEST(CudaGemmBits, PlanCacheIsBoundedAndReplansTheSameBits) {
  const int64_t N = 4, K = 8, rows = static_cast<int64_t>(jtok::cuda::Matmul::kMaxPlans) + 10;
  auto a = upload<float>(randn(rows * K, 10)), b = upload<float>(randn(N * K, 11));
  DeviceBuffer<float> c(rows * N);
  jtok::cuda::Matmul mm;
  mm.gemm<float, float>(false, true, 3, N, K, 1.0f, a.get(), K, b.get(), K, 0.0f, c.get(), N, nullptr, nullptr);
  const std::vector<float> first = download(c);
  for (int64_t M = 1; M <= rows; ++M) {
    mm.gemm<float, float>(false, true, M, N, K, 1.0f, a.get(), K, b.get(), K, 0.0f, c.get(), N, nullptr, nullptr);
    ASSERT_LE(mm.cached_plans(), jtok::cuda::Matmul::kMaxPlans) << M;
  }
  EXPECT_LT(mm.cached_plans(), 100u);  // started over once
  mm.gemm<float, float>(false, true, 3, N, K, 1.0f, a.get(), K, b.get(), K, 0.0f, c.get(), N, nullptr, nullptr);
  const std::vector<float> again = download(c);
  EXPECT_EQ(std::vector<float>(again.begin(), again.begin() + 3 * N),
            std::vector<float>(first.begin(), first.begin() + 3 * N));
}

TEST(CudaGemmBits, TwoRunsAreBitwiseEqual) {
  const auto in = make_linear(129, 384, 1152, 5);
  CudaCase c{"linear fwd+bwd", "N 129, C 384, OC 1152", {1e-5, 1e-2}};
  c.gpu = [in](DType t) { return t == DType::f32 ? gpu_linear<float>(*in) : gpu_linear<__nv_bfloat16>(*in); };
  expect_deterministic(c, DType::f32);
  expect_deterministic(c, DType::bf16);
}

// linear_forward_residual (out = residual + inp W^T + b, cuBLASLt's C != D) gives the bits of a copy
// of the residual accumulated onto by linear_forward: through cuBLASLt (50 rows) and the
// row-invariant products (5 rows under RowInvariantProducts), with the residual apart and as out
// itself, fp32 and bf16; and the residual is left as it was.
template <typename T>
void expect_residual_bits(int64_t N, int64_t invariant_rows) {
  const int64_t C = 96, OC = 72;
  auto x = upload<T>(randn(N * C, 20)), w = upload<T>(randn(OC * C, 21, 0.1f)), b = upload<T>(randn(OC, 22));
  const std::vector<float> res_h = randn(N * OC, 23);
  auto res = upload<T>(res_h), copied = upload<T>(res_h), in_place = upload<T>(res_h);
  DeviceBuffer<T> out(static_cast<size_t>(N * OC));
  jtok::cuda::Matmul mm;
  const jtok::cuda::RowInvariantProducts scope(mm, invariant_rows);
  jtok::cuda::linear_forward<T, T>(mm, copied.get(), x.get(), w.get(), b.get(), N, C, OC, true, nullptr);
  jtok::cuda::linear_forward_residual<T, T>(mm, out.get(), res.get(), x.get(), w.get(), b.get(), N, C, OC, nullptr);
  jtok::cuda::linear_forward_residual<T, T>(mm, in_place.get(), in_place.get(), x.get(), w.get(), b.get(), N, C, OC,
                                            nullptr);
  const std::vector<float> want = download(copied);
  EXPECT_EQ(download(out), want) << "N " << N << " row-invariant up to " << invariant_rows;
  EXPECT_EQ(download(in_place), want) << "in place, N " << N;
  EXPECT_EQ(download(res), download(upload<T>(res_h))) << "the residual changed";
}

TEST(CudaGemmBits, ResidualIsTheCopyThenTheAccumulate) {
  expect_residual_bits<float>(50, 0);
  expect_residual_bits<float>(5, 8);
  expect_residual_bits<__nv_bfloat16>(50, 0);
  expect_residual_bits<__nv_bfloat16>(5, 8);
}

}  // namespace

// cuBLASLt is loaded on first use (cuda/cublaslt_api.h), not linked: the library and every function
// the products call are found (no GPU needed), and statuses read back as cuBLASLt's own strings.
TEST(CublasLtApi, LoadsOnFirstUse) {
  const jtok::cuda::CublasLtApi& lt = jtok::cuda::cublaslt();
  EXPECT_EQ(&lt, &jtok::cuda::cublaslt());  // once per process
  EXPECT_NE(lt.Matmul, nullptr);
  EXPECT_NE(lt.MatmulAlgoGetHeuristic, nullptr);
  const std::string not_init = lt.GetStatusString(CUBLAS_STATUS_NOT_INITIALIZED);  // e.g. "the library was not initialized"
  EXPECT_FALSE(not_init.empty());
  EXPECT_NE(not_init, lt.GetStatusString(CUBLAS_STATUS_SUCCESS));
}
