// Top-K selection shared by the MoE router and JTok-M's router, so both break ties the same way.
#pragma once
#include <cstdint>

namespace jtok {

// The K largest of x (n values) into idx (K): repeatedly the first maximum among the unchosen, so
// the order is descending and ties go to the lower index (docs/model.md; the reference's stable
// descending sort gives the same).
template <typename T>
void top_k_lower_index(int32_t* idx, const T* x, int64_t n, int64_t K) {
  for (int64_t j = 0; j < K; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < n; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken |= idx[i] == e;
      if (!taken && (best < 0 || x[e] > x[best])) best = e;
    }
    idx[j] = static_cast<int32_t>(best);
  }
}

}  // namespace jtok
