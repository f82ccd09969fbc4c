#include "ops/embedding.h"

#include <cstring>

#include <omp.h>

#include "core/parallel.h"

namespace jtok {

void embedding_forward(float* out, const int32_t* ids, const float* weight, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * C, weight + static_cast<int64_t>(ids[n]) * C, C * sizeof(float));
}

// Each thread owns the rows with id % threads == its number, so no two threads add to one row.
void embedding_backward(float* dweight, const float* dout, const int32_t* ids, int64_t N, int64_t C) {
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), me = omp_get_thread_num();
    for (int64_t n = 0; n < N; ++n) {
      if (ids[n] % nt != me) continue;
      float* row = dweight + static_cast<int64_t>(ids[n]) * C;
      const float* g = dout + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) row[c] += g[c];
    }
  }
}

void embedding_forward_ref(float* out, const int32_t* ids, const float* weight, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = weight[static_cast<int64_t>(ids[n]) * C + c];
}

void embedding_backward_ref(float* dweight, const float* dout, const int32_t* ids, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) dweight[static_cast<int64_t>(ids[n]) * C + c] += dout[n * C + c];
}

}  // namespace jtok
