// Staged token-table rows (src/cuda/row_staging.h): host gather into pinned staging, then an
// asynchronous copy on a side stream. Host code only.
#include "cuda/row_staging.h"

namespace jtok::cuda {

template <typename T>
void gather_rows_to_staging(T* staging, const TokenTable& t, const int32_t* ids, int64_t n) {
  if (n <= 0) return;
  if constexpr (sizeof(T) == sizeof(float))
    gather_rows(staging, t, ids, n);
  else
    gather_rows_bf16(reinterpret_cast<uint16_t*>(staging), t, ids, n);  // a bf16 table's stored bits
}

template <typename T>
void copy_staged_rows(T* out, const T* staging, int64_t n, int64_t d, cudaStream_t side, cudaEvent_t ready) {
  if (n > 0)
    JTOK_CUDA_CHECK(
        cudaMemcpyAsync(out, staging, static_cast<size_t>(n * d) * sizeof(T), cudaMemcpyHostToDevice, side));
  if (ready) JTOK_CUDA_CHECK(cudaEventRecord(ready, side));
}

template void gather_rows_to_staging<float>(float*, const TokenTable&, const int32_t*, int64_t);
template void gather_rows_to_staging<__nv_bfloat16>(__nv_bfloat16*, const TokenTable&, const int32_t*, int64_t);
template void copy_staged_rows<float>(float*, const float*, int64_t, int64_t, cudaStream_t, cudaEvent_t);
template void copy_staged_rows<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, int64_t, int64_t, cudaStream_t,
                                              cudaEvent_t);

}  // namespace jtok::cuda
