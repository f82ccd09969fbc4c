// cuBLASLt on the CPU (tests/cuda/emu/include/cublasLt.h) and src/cuda/cublaslt_api.h's table of
// it: src/cuda/matmul.cu runs unchanged on top. The product is cuBLASLt's, column-major:
//   D (m,n) = alpha op(A) (m,k) op(B) (k,n) + beta C (m,n) [+ bias (m) on every column]
// summed in fp32 in k order, C unread when beta is 0 (as cuBLAS), then rounded once to D's type.
// What cuBLASLt refuses is refused: a leading dimension below the rows, shapes that do not chain,
// a compute or type combination matmul.cu does not ask for (only fp32 compute; A = B type, C = D
// type, bf16 x bf16 -> bf16 or fp32, fp32 -> fp32), the bias epilogue without a bias, and an
// operand less aligned than the preference the algorithm was chosen under said.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstring>
#include <vector>

#include "cuda/cublaslt_api.h"
#include "emu_runtime.h"

struct cublasLtContext {
  int magic = 0x17;
};
struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
};
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's default is 256 bytes
};

namespace {

template <typename T>
cublasStatus_t set_value(T& field, const void* buf, size_t n) {
  if (!buf || n != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

float load(const void* p, cudaDataType_t t, int64_t i) {
  if (t == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

void store(void* p, cudaDataType_t t, int64_t i, float v) {
  if (t == CUDA_R_16BF)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(p)[i] = v;
}

// The op(X) shape (rows, cols) of a stored layout.
void op_shape(const cublasLtMatrixLayoutOpaque_t& l, cublasOperation_t op, uint64_t& r, uint64_t& c) {
  r = op == CUBLAS_OP_N ? l.rows : l.cols;
  c = op == CUBLAS_OP_N ? l.cols : l.rows;
}

// Everything the heuristic and the product both check: the types, the chain of shapes, D = C.
cublasStatus_t check_problem(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                             cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl) {
  if (!d || !a || !b || !c || !dl) return CUBLAS_STATUS_INVALID_VALUE;
  if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (a->type != b->type || c->type != dl->type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (a->type == CUDA_R_32F && c->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  uint64_t am, ak, bk, bn;
  op_shape(*a, d->op_a, am, ak);
  op_shape(*b, d->op_b, bk, bn);
  if (ak != bk || c->rows != am || c->cols != bn || dl->rows != am || dl->cols != bn || c->ld != dl->ld)
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

bool aligned(const void* p, uint64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS (emulated)";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED (emulated)";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (emulated)";
    case CUBLAS_STATUS_MISALIGNED: return "an operand less aligned than its algorithm (emulated)";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED (emulated)";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED (emulated)";
  }
  return "unknown cuBLAS status (emulated)";
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  *d = new cublasLtMatmulDescOpaque_t{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                              const void* buf, size_t n) {
  switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return set_value(d->op_a, buf, n);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set_value(d->op_b, buf, n);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_value(d->epilogue, buf, n);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_value(d->bias, buf, n);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a, const void* buf, size_t n) {
  switch (a) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set_value(p->workspace, buf, n);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set_value(p->align[0], buf, n);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set_value(p->align[1], buf, n);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set_value(p->align[2], buf, n);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set_value(p->align[3], buf, n);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t t, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (t != CUDA_R_32F && t != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (ld < static_cast<int64_t>(rows) || ld < 1) return CUBLAS_STATUS_INVALID_VALUE;
  *l = new cublasLtMatrixLayoutOpaque_t{t, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}

// One algorithm for every problem: it records the alignments it was chosen for (data[0..3]).
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t p, int wanted,
                                              cublasLtMatmulHeuristicResult_t* out, int* found) {
  if (!h || !p || !out || !found || wanted < 1) return CUBLAS_STATUS_INVALID_VALUE;
  *found = 0;
  if (const cublasStatus_t st = check_problem(d, a, b, c, dl); st != CUBLAS_STATUS_SUCCESS) return st;
  for (uint32_t al : p->align)
    if (al == 0 || (al & (al - 1)) != 0) return CUBLAS_STATUS_INVALID_VALUE;
  *out = {};
  for (int i = 0; i < 4; ++i) out->algo.data[i] = p->align[i];
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

// D = alpha op(A) op(B) + beta C (+ bias), as described at the top.
void product(const cublasLtMatmulDescOpaque_t* d, const cublasLtMatrixLayoutOpaque_t* a,
             const cublasLtMatrixLayoutOpaque_t* b, const cublasLtMatrixLayoutOpaque_t* c,
             const cublasLtMatrixLayoutOpaque_t* dl, float al, float be, const void* A, const void* B, const void* C,
             void* D) {
  uint64_t m, k, k2, n;
  op_shape(*a, d->op_a, m, k);
  op_shape(*b, d->op_b, k2, n);
  // op(X)(i, j) of a column-major layout: X(i, j) at i + j ld, or X(j, i) when transposed.
  auto at = [](const cublasLtMatrixLayoutOpaque_t& l, cublasOperation_t op, uint64_t i, uint64_t j) {
    return op == CUBLAS_OP_N ? static_cast<int64_t>(i + j * l.ld) : static_cast<int64_t>(j + i * l.ld);
  };
  // op(A) as (m, k) rows of floats, read once: the sums below run along contiguous memory.
  std::vector<float> rows(m * k), col(k);
  for (uint64_t i = 0; i < m; ++i)
    for (uint64_t kk = 0; kk < k; ++kk) rows[i * k + kk] = load(A, a->type, at(*a, d->op_a, i, kk));
  for (uint64_t j = 0; j < n; ++j) {
    for (uint64_t kk = 0; kk < k; ++kk) col[kk] = load(B, b->type, at(*b, d->op_b, kk, j));
    for (uint64_t i = 0; i < m; ++i) {
      float s = 0.0f;
      const float* row = rows.data() + i * k;
      for (uint64_t kk = 0; kk < k; ++kk) s += row[kk] * col[kk];
      const int64_t o = static_cast<int64_t>(i + j * dl->ld);
      float v = al * s;
      if (be != 0.0f) v += be * load(C, c->type, static_cast<int64_t>(i + j * c->ld));
      if (d->epilogue == CUBLASLT_EPILOGUE_BIAS) v += load(d->bias, dl->type, static_cast<int64_t>(i));
      store(D, dl->type, o, v);
    }
  }
}

}  // namespace

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t* algo, void* /*workspace: none needed*/, size_t,
                              CUstream_st* stream) {
  if (!h || !alpha || !beta || !algo || !A || !B || !D) return CUBLAS_STATUS_INVALID_VALUE;
  if (const cublasStatus_t st = check_problem(d, a, b, c, dl); st != CUBLAS_STATUS_SUCCESS) return st;
  const void* ptrs[4] = {A, B, C, D};
  for (int i = 0; i < 4; ++i)
    if (ptrs[i] && !aligned(ptrs[i], algo->data[i])) return CUBLAS_STATUS_MISALIGNED;
  if (d->epilogue == CUBLASLT_EPILOGUE_BIAS && !d->bias) return CUBLAS_STATUS_INVALID_VALUE;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  if (be != 0.0f && !C) return CUBLAS_STATUS_INVALID_VALUE;
  // Run on the stream as a kernel is (EMU_STREAMS=lazy queues it; a capture records it, to run at each
  // replay), with the descriptors as they are now.
  const cublasLtMatmulDescOpaque_t dd = *d;
  const cublasLtMatrixLayoutOpaque_t la = *a, lb = *b, lc = c ? *c : *dl, ld = *dl;
  const cudaError_t e = emu::submit(stream, [=] {
    ++emu::work_counts().products;
    product(&dd, &la, &lb, &lc, &ld, al, be, A, B, C, D);
  });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

namespace jtok::cuda {

// The table src/cuda/cublaslt_api.cu would fill with dlsym, filled with the functions above.
const CublasLtApi& cublaslt() {
  static const CublasLtApi api{cublasLtCreate,
                               cublasLtDestroy,
                               cublasLtGetStatusString,
                               cublasLtMatmul,
                               cublasLtMatmulAlgoGetHeuristic,
                               cublasLtMatmulDescCreate,
                               cublasLtMatmulDescDestroy,
                               cublasLtMatmulDescSetAttribute,
                               cublasLtMatmulPreferenceCreate,
                               cublasLtMatmulPreferenceDestroy,
                               cublasLtMatmulPreferenceSetAttribute,
                               cublasLtMatrixLayoutCreate,
                               cublasLtMatrixLayoutDestroy};
  return api;
}

}  // namespace jtok::cuda
