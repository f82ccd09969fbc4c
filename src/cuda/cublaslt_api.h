// cuBLASLt reached through a table of its functions, loaded with dlopen on first use. Linked the
// usual way, libcublasLt (~0.5 GB) is mapped and relocated at every jtok start, GPU or not: ~200 MB
// of resident memory for `jtok --help` on a CPU-only machine. Loaded here, only a process that
// multiplies on a GPU pays it. Host code only; includes the toolkit's cublasLt.h for the types.
#pragma once
#include <cublasLt.h>

namespace jtok::cuda {

struct CublasLtApi {
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtDestroy) Destroy;
  decltype(&cublasLtGetStatusString) GetStatusString;
  decltype(&cublasLtMatmul) Matmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
};

// The library loaded (libcublasLt.so.<major of the toolkit built with>, then libcublasLt.so) and
// every function found, once per process; an Error naming the library and dlerror() otherwise.
const CublasLtApi& cublaslt();

}  // namespace jtok::cuda
