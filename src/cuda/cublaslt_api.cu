// cuBLASLt's functions loaded on first use (src/cuda/cublaslt_api.h).
#include "cuda/cublaslt_api.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "core/error.h"

namespace jtok::cuda {

namespace {

void* open_library() {
  const std::string versioned = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  std::string why;
  for (const std::string& name : {versioned, std::string("libcublasLt.so")}) {
    if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    const char* e = dlerror();
    why += (why.empty() ? "" : "; ") + std::string(e ? e : name + ": not found");
  }
  fail("cuBLASLt could not be loaded (", why, "): put the CUDA toolkit's lib64 on LD_LIBRARY_PATH");
}

template <typename F>
void find(void* lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn) fail("cuBLASLt: ", name, " not found in the loaded library (a toolkit older than the headers?)");
}

CublasLtApi load() {
  void* lib = open_library();  // kept open for the process
  CublasLtApi a{};
  find(lib, a.Create, "cublasLtCreate");
  find(lib, a.Destroy, "cublasLtDestroy");
  find(lib, a.GetStatusString, "cublasLtGetStatusString");
  find(lib, a.Matmul, "cublasLtMatmul");
  find(lib, a.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  find(lib, a.MatmulDescCreate, "cublasLtMatmulDescCreate");
  find(lib, a.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
  find(lib, a.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  find(lib, a.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  find(lib, a.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  find(lib, a.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  find(lib, a.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  find(lib, a.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  return a;
}

}  // namespace

const CublasLtApi& cublaslt() {
  static std::once_flag once;
  static CublasLtApi api;
  std::call_once(once, [] { api = load(); });
  return api;
}

}  // namespace jtok::cuda
