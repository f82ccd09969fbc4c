// JTok-M's mix at one position, e = sum_k w_k E_{sel_k}[x] (paper eq. 8), and its backward: the
// arithmetic every path runs, so that all give the same bits: the local gather (model/jtokm.cpp)
// and, under embedding parallelism, the rows' owners (premix) or the requester (naive) in src/dist.
// e is zeroed, then the K terms are added in k order.
#pragma once
#include <cstdint>

namespace jtok {

// e (d) += w * row: one term of the mix.
inline void mix_term(float* e, float w, const float* row, int64_t d) {
#pragma omp simd
  for (int64_t j = 0; j < d; ++j) e[j] += w * row[j];
}

// dL/dw_k = de . row_k: the gradient of one term's weight.
inline float mix_term_dw(const float* de, const float* row, int64_t d) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t j = 0; j < d; ++j) acc += de[j] * row[j];
  return acc;
}

// g (d) += w * de: one term's contribution to its row's gradient (the same arithmetic as mix_term).
inline void mix_term_grad(float* g, float w, const float* de, int64_t d) { mix_term(g, w, de, d); }

// One position's mix, e (d) = sum_k w[k] row(k), k in order from e = 0; row(k) gives the k-th
// selected row (the gathered rows wherever the caller keeps them).
template <typename RowOf>
inline void mix_position(float* e, RowOf row, const float* w, int64_t K, int64_t d) {
  for (int64_t j = 0; j < d; ++j) e[j] = 0.0f;
  for (int64_t k = 0; k < K; ++k) mix_term(e, w[k], row(k), d);
}
// Its weights' gradients: dw (K), dw[k] = de . row(k).
template <typename RowOf>
inline void mix_position_dw(float* dw, const float* de, RowOf row, int64_t K, int64_t d) {
  for (int64_t k = 0; k < K; ++k) dw[k] = mix_term_dw(de, row(k), d);
}

}  // namespace jtok
