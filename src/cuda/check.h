// Error checks for CUDA runtime and cuBLASLt calls: a failure throws jtok::Error naming the call,
// file:line and the library's own error string (the jtok binary prints it and exits non-zero); one
// of CUDA's sticky errors, which leave the context unusable until the process ends, throws
// jtok::DeviceLost (a server stops taking work on it).
// Host code only; includable from .cu and from .cpp compiled by g++.
#pragma once
#include <cuda_runtime_api.h>

#include <sstream>

#include "core/error.h"
#include "cuda/cublaslt_api.h"

namespace jtok::cuda {

// The errors CUDA documents as leaving "the process in an inconsistent state": every later call
// returns them, and only a new process can use the device again.
inline bool sticky_cuda_error(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

[[noreturn]] inline void cuda_call_failed(cudaError_t e, const char* file, int line, const char* expr) {
  std::ostringstream os;
  os << file << ":" << line << ": " << expr << ": " << cudaGetErrorName(e) << " (" << cudaGetErrorString(e) << ")";
  if (sticky_cuda_error(e)) throw DeviceLost(os.str() + "; the GPU's context is lost: restart the process");
  throw Error(os.str());
}

}  // namespace jtok::cuda

#define JTOK_CUDA_CHECK(expr)                                                                                     \
  do {                                                                                                            \
    const cudaError_t jtok_cuda_err_ = (expr);                                                                    \
    if (jtok_cuda_err_ != cudaSuccess) ::jtok::cuda::cuda_call_failed(jtok_cuda_err_, __FILE__, __LINE__, #expr); \
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
