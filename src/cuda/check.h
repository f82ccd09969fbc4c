// Error checks for CUDA runtime and cuBLASLt calls: a failure throws jtok::Error naming the call,
// file:line and the library's own error string (the jtok binary prints it and exits non-zero).
// Host code only; includable from .cu and from .cpp compiled by g++.
#pragma once
#include <cuda_runtime_api.h>

#include "core/error.h"
#include "cuda/cublaslt_api.h"

#define JTOK_CUDA_CHECK(expr)                                                                        \
  do {                                                                                               \
    const cudaError_t jtok_cuda_err_ = (expr);                                                       \
    if (jtok_cuda_err_ != cudaSuccess)                                                               \
      ::jtok::fail(__FILE__, ":", __LINE__, ": ", #expr, ": ", cudaGetErrorName(jtok_cuda_err_), " (", \
                   cudaGetErrorString(jtok_cuda_err_), ")");                                         \
  } while (0)

#define JTOK_CUBLAS_CHECK(expr)                                                                  \
  do {                                                                                           \
    const cublasStatus_t jtok_cublas_st_ = (expr);                                               \
    if (jtok_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                                \
      ::jtok::fail(__FILE__, ":", __LINE__, ": ", #expr, ": cuBLAS status ",                     \
                   static_cast<int>(jtok_cublas_st_), " (",                                      \
                   ::jtok::cuda::cublaslt().GetStatusString(jtok_cublas_st_), ")");              \
  } while (0)

// After a kernel launch: a bad launch configuration is reported here, not at the next sync.
#define JTOK_CUDA_CHECK_LAUNCH() JTOK_CUDA_CHECK(cudaGetLastError())
