// cuBLASLt's names for src/cuda/cublaslt_api.h's table of function types (tests/cuda/emu): types
// and declarations only, no definitions: emulated code that calls cuBLASLt fails to link.
#pragma once
#include <cstddef>
#include <cstdint>

typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;
typedef struct cublasLtContext* cublasLtHandle_t;
typedef struct cublasLtMatmulDescOpaque_t* cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutOpaque_t* cublasLtMatrixLayout_t;
typedef struct cublasLtMatmulPreferenceOpaque_t* cublasLtMatmulPreference_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct cublasLtMatmulHeuristicResult_t cublasLtMatmulHeuristicResult_t;
typedef int cublasComputeType_t, cudaDataType_t, cublasLtMatmulDescAttributes_t,
    cublasLtMatmulPreferenceAttributes_t;
struct CUstream_st;

cublasStatus_t cublasLtCreate(cublasLtHandle_t*);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t);
const char* cublasLtGetStatusString(cublasStatus_t);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*, cublasLtMatrixLayout_t,
                              const void*, cublasLtMatrixLayout_t, const void*, const void*, cublasLtMatrixLayout_t,
                              void*, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*, void*, size_t, CUstream_st*);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t*, int*);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t*, cublasComputeType_t, cudaDataType_t);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void*, size_t);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t*);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                                    const void*, size_t);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t*, cudaDataType_t, uint64_t, uint64_t, int64_t);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t);
