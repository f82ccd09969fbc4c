// cuBLASLt products in the row-major convention of ops/linear.h. cuBLASLt is column-major: a
// row-major (R,C) matrix with row stride ld is the column-major (C,R) matrix with leading dimension
// ld, so the row-major C (M,N) = op(A) op(B) is computed as the column-major C^T (N,M) =
// op(B)^T op(A)^T: cuBLASLt's first operand is our B (transposed when trans_b), its second our A.
//   linear forward   out (N,OC)  = inp (N,C) weight (OC,C)^T      gemm(NT): M N, N OC, K C
//   backward dinp    dinp (N,C) += dout (N,OC) weight (OC,C)      gemm(NN): M N, N C, K OC
//   backward dweight dW (OC,C)  += dout^T (OC,N) inp (N,C)        gemm(TN): M OC, N C, K N
#include "cuda/matmul.h"

#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <map>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/cublaslt_api.h"
#include "cuda/device.h"
#include "cuda/row_invariant_linear.h"
#include "cuda/row_invariant_mma.h"

namespace jtok::cuda {
namespace {

template <typename T>
constexpr cudaDataType_t data_type();
template <>
constexpr cudaDataType_t data_type<float>() { return CUDA_R_32F; }
template <>
constexpr cudaDataType_t data_type<__nv_bfloat16>() { return CUDA_R_16BF; }

// The largest power of two (up to 256) dividing the address: the heuristic must pick an algorithm
// that works for an operand that starts inside a bigger buffer.
int64_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int64_t al = 256;
  while (al > 1 && a % static_cast<uintptr_t>(al) != 0) al /= 2;
  return al;
}

// Descriptors and algorithm of one product shape.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  cublasLtMatmulAlgo_t algo{};
};

// trans_a, trans_b, M, N, K, lda, ldb, ldc, in type, out type, bias, alignments of A, B, C.
using PlanKey = std::array<int64_t, 14>;

void destroy(Plan& p) {
  if (p.a) cublaslt().MatrixLayoutDestroy(p.a);
  if (p.b) cublaslt().MatrixLayoutDestroy(p.b);
  if (p.c) cublaslt().MatrixLayoutDestroy(p.c);
  if (p.desc) cublaslt().MatmulDescDestroy(p.desc);
}

}  // namespace

struct Matmul::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<PlanKey, Plan> plans;

  Plan& plan(const PlanKey& key, cudaDataType_t in, cudaDataType_t out);
  void make_layouts(Plan& p, const PlanKey& key, cudaDataType_t in, cudaDataType_t out);
  void choose_algorithm(Plan& p, const PlanKey& key);
};

void Matmul::Impl::make_layouts(Plan& p, const PlanKey& key, cudaDataType_t in, cudaDataType_t out) {
  const bool ta = key[0] != 0, tb = key[1] != 0;
  const int64_t M = key[2], N = key[3], K = key[4], lda = key[5], ldb = key[6], ldc = key[7];
  // Stored column-major shapes (rows, cols, ld): our B is (N,K) column-major, or (K,N) if trans_b;
  // our A is (K,M), or (M,K) if trans_a; C is (N,M).
  JTOK_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&p.a, in, tb ? K : N, tb ? N : K, ldb));
  JTOK_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&p.b, in, ta ? M : K, ta ? K : M, lda));
  JTOK_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&p.c, out, N, M, ldc));
}

void Matmul::Impl::choose_algorithm(Plan& p, const PlanKey& key) {
  cublasLtMatmulPreference_t pref = nullptr;
  JTOK_CUBLAS_CHECK(cublaslt().MatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t align_b = static_cast<uint32_t>(key[11]), align_a = static_cast<uint32_t>(key[12]),
                 align_c = static_cast<uint32_t>(key[13]);  // cuBLASLt's A is our B and the reverse
  cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a);
  cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b);
  cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c);
  cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublaslt().MatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublaslt().MatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    fail("cuBLASLt has no algorithm for the product M ", key[2], " N ", key[3], " K ", key[4], " (trans ", key[0],
         key[1], ", row strides ", key[5], " ", key[6], " ", key[7], "): ", cublaslt().GetStatusString(st));
  p.algo = result.algo;
}

Plan& Matmul::Impl::plan(const PlanKey& key, cudaDataType_t in, cudaDataType_t out) {
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  Plan p;
  try {
    JTOK_CUBLAS_CHECK(cublaslt().MatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = key[1] ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = key[0] ? CUBLAS_OP_T : CUBLAS_OP_N;
    JTOK_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    JTOK_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    // The bias is per row of cuBLASLt's D (N,M): per output column of ours, as a linear bias.
    const cublasLtEpilogue_t epi = key[10] ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    JTOK_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    make_layouts(p, key, in, out);
    choose_algorithm(p, key);
  } catch (...) {
    destroy(p);
    throw;
  }
  if (plans.size() >= Matmul::kMaxPlans) {  // start over (matmul.h: kMaxPlans)
    for (auto& [k, old] : plans) destroy(old);
    plans.clear();
  }
  return plans.emplace(key, p).first->second;
}

Matmul::Matmul() : impl_(std::make_unique<Impl>()) {
  JTOK_CUBLAS_CHECK(cublaslt().Create(&impl_->handle));
  JTOK_CUDA_CHECK(cudaMalloc(&impl_->workspace, kWorkspaceBytes));
  note_device_bytes(static_cast<int64_t>(kWorkspaceBytes));
}

Matmul::~Matmul() {
  for (auto& [key, p] : impl_->plans) destroy(p);
  cudaFree(impl_->workspace);
  note_device_bytes(-static_cast<int64_t>(kWorkspaceBytes));
  cublaslt().Destroy(impl_->handle);
}

size_t Matmul::cached_plans() const { return impl_->plans.size(); }

template <typename In, typename Out>
void Matmul::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const In* A, int64_t lda,
                  const In* B, int64_t ldb, float beta, Out* C, int64_t ldc, const Out* bias, cudaStream_t stream,
                  const Out* c_in) {
  if (M < 0 || N < 0 || K < 0 || lda < (trans_a ? M : K) || ldb < (trans_b ? K : N) || ldc < N)
    fail("cuda gemm: bad shape M ", M, " N ", N, " K ", K, " with row strides ", lda, " ", ldb, " ", ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: only C = beta C (+ bias) would remain
    if (beta == 1.0f && !bias) return;
    fail("cuda gemm: K 0 with beta ", beta, " is not supported");
  }
  if (!c_in) c_in = C;
  const PlanKey key{trans_a, trans_b, M, N, K, lda, ldb, ldc, data_type<In>(), data_type<Out>(), bias != nullptr,
                    alignment(A), alignment(B), std::min(alignment(C), alignment(c_in))};
  Plan& p = impl_->plan(key, data_type<In>(), data_type<Out>());
  if (bias)
    JTOK_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  JTOK_CUBLAS_CHECK(cublaslt().Matmul(impl_->handle, p.desc, &alpha, B, p.a, A, p.b, &beta, c_in, p.c, C, p.c, &p.algo,
                                   impl_->workspace, kWorkspaceBytes, stream));
}

namespace {
// One Matmul a thread for every gemm_lt<In, Out> (a function-local static in the template would be
// one per type pair: a second 32 MiB workspace for the LM head's fp32 dW products).
Matmul& thread_matmul() {
  thread_local Matmul mm;
  return mm;
}
}  // namespace

template <typename In, typename Out>
void gemm_lt(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const In* A, int64_t lda,
             const In* B, int64_t ldb, float beta, Out* C, int64_t ldc, cudaStream_t stream) {
  Matmul& mm = thread_matmul();
  mm.gemm<In, Out>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nullptr, stream);
}

template <typename In, typename Out>
void linear_forward(Matmul& mm, Out* out, const In* inp, const In* weight, const Out* bias, int64_t N, int64_t C,
                    int64_t OC, bool accumulate, cudaStream_t stream) {
  if (N > 0 && N <= mm.row_invariant_rows())
    return row_invariant_product<In, Out>(mm.row_invariant_tensor_cores(), out, inp, weight, bias, N, C, OC, accumulate,
                                          stream);
  // out (N,OC) = inp (N,C) weight (OC,C)^T
  mm.gemm<In, Out>(false, true, N, OC, C, 1.0f, inp, C, weight, C, accumulate ? 1.0f : 0.0f, out, OC, bias, stream);
}

template <typename In, typename Out>
void linear_forward_residual(Matmul& mm, Out* out, const Out* residual, const In* inp, const In* weight,
                             const Out* bias, int64_t N, int64_t C, int64_t OC, cudaStream_t stream) {
  if (N > 0 && N <= mm.row_invariant_rows()) {
    if (residual != out)
      JTOK_CUDA_CHECK(cudaMemcpyAsync(out, residual, static_cast<size_t>(N * OC) * sizeof(Out),
                                      cudaMemcpyDeviceToDevice, stream));
    return row_invariant_product<In, Out>(mm.row_invariant_tensor_cores(), out, inp, weight, bias, N, C, OC, true,
                                          stream);
  }
  mm.gemm<In, Out>(false, true, N, OC, C, 1.0f, inp, C, weight, C, 1.0f, out, OC, bias, stream, residual);
}

template <typename E, typename DW>
void linear_backward(Matmul& mm, E* dinp, DW* dweight, const E* dout, const E* inp, const E* weight, int64_t N,
                     int64_t C, int64_t OC, cudaStream_t stream, bool add_to_dinp, bool add_to_dweight) {
  // dinp (N,C) (+)= dout (N,OC) weight (OC,C)
  if (dinp)
    mm.gemm<E, E>(false, false, N, C, OC, 1.0f, dout, OC, weight, C, add_to_dinp ? 1.0f : 0.0f, dinp, C, nullptr,
                  stream);
  // dweight (OC,C) (+)= dout^T (OC,N) inp (N,C)
  if (dweight)
    mm.gemm<E, DW>(true, false, OC, C, N, 1.0f, dout, OC, inp, C, add_to_dweight ? 1.0f : 0.0f, dweight, C, nullptr,
                   stream);
}

using bf16 = __nv_bfloat16;
#define JTOK_MATMUL_INSTANTIATE(In, Out)                                                                               \
  template void Matmul::gemm<In, Out>(bool, bool, int64_t, int64_t, int64_t, float, const In*, int64_t, const In*,     \
                                      int64_t, float, Out*, int64_t, const Out*, cudaStream_t, const Out*);            \
  template void gemm_lt<In, Out>(bool, bool, int64_t, int64_t, int64_t, float, const In*, int64_t, const In*, int64_t, \
                                 float, Out*, int64_t, cudaStream_t);                                                  \
  template void linear_forward<In, Out>(Matmul&, Out*, const In*, const In*, const Out*, int64_t, int64_t, int64_t,    \
                                        bool, cudaStream_t);                                                           \
  template void linear_forward_residual<In, Out>(Matmul&, Out*, const Out*, const In*, const In*, const Out*, int64_t, \
                                                 int64_t, int64_t, cudaStream_t);                                      \
  template void linear_backward<In, Out>(Matmul&, In*, Out*, const In*, const In*, const In*, int64_t, int64_t,        \
                                         int64_t, cudaStream_t, bool, bool);
JTOK_MATMUL_INSTANTIATE(float, float)
JTOK_MATMUL_INSTANTIATE(bf16, bf16)
JTOK_MATMUL_INSTANTIATE(bf16, float)
#undef JTOK_MATMUL_INSTANTIATE

}  // namespace jtok::cuda
