// The row work of one score block of O(T) attention (FlashAttention-2's algorithm), shared by the
// fp32 kernels (ops/attention.cpp) and the mixed-precision ones (ops/attention_bf16.cpp), which
// differ only in how the blocks' matrix products are computed; the decoder's softmax
// (ops/attention_decode.cpp) uses its exp row too. Internal to ops/.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/fast_exp.h"

namespace jtok::attn {

// Row t of a score block: exponentiate the first `valid` entries against m_new (0 after), return the
// sum of the exponentials.
inline float exp_row(float* row, int64_t valid, int64_t w, float m_new) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < valid; ++j) {
    const float e = fast_expf(row[j] - m_new);
    row[j] = e;
    sum += e;
  }
  for (int64_t j = valid; j < w; ++j) row[j] = 0.0f;
  return sum;
}

// Forward, rows [r0, r1) against keys [c0, c1): S (r1-r0, w) holds the scaled scores and becomes
// exp(S - m_new) (0 past the diagonal); each row's running max m and sum l are updated, and the
// output rows o (row stride qd) that earlier key blocks wrote are rescaled to the new maximum.
inline void online_softmax_block(float* S, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* mrow, float* lrow,
                                 float* oh, int64_t qd, int64_t hd) {
  const int64_t w = c1 - c0;
  for (int64_t t = r0; t < r1; ++t) {
    float* row = S + (t - r0) * w;
    const int64_t valid = std::min(c1, t + 1) - c0;  // >= 1: c0 <= r0 <= t
    float mx = row[0];
#pragma omp simd reduction(max : mx)
    for (int64_t j = 1; j < valid; ++j) mx = row[j] > mx ? row[j] : mx;
    const float m_old = mrow[t - r0], m_new = std::max(m_old, mx);
    const float sum = exp_row(row, valid, w, m_new);
    if (c0 == 0) {
      lrow[t - r0] = sum;
    } else {  // rescale what the earlier key blocks gave this row to the new maximum
      const float alpha = std::exp(m_old - m_new);
      lrow[t - r0] = lrow[t - r0] * alpha + sum;
      float* o = oh + t * qd;
#pragma omp simd
      for (int64_t i = 0; i < hd; ++i) o[i] *= alpha;
    }
    mrow[t - r0] = m_new;
  }
}

// Forward, the end of a row block: out rows divided by their sums; lse (one per row) = m + log l.
inline void finish_rows(float* oh, float* lse, int64_t r0, int64_t r1, const float* mrow, const float* lrow,
                        int64_t qd, int64_t hd) {
  for (int64_t t = r0; t < r1; ++t) {
    const float inv = 1.0f / lrow[t - r0];
    float* o = oh + t * qd;
#pragma omp simd
    for (int64_t i = 0; i < hd; ++i) o[i] *= inv;
    lse[t] = mrow[t - r0] + std::log(lrow[t - r0]);
  }
}

// Backward: D_t = sum_i dO_ti O_ti = sum_j P_tj dP_tj (the softmax backward's row term), rows [r0, r1).
inline void softmax_row_terms(float* D, const float* dOh, const float* Oh, int64_t r0, int64_t r1, int64_t qd,
                              int64_t hd) {
  for (int64_t t = r0; t < r1; ++t) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < hd; ++i) acc += dOh[t * qd + i] * Oh[t * qd + i];
    D[t - r0] = acc;
  }
}

// Backward: P (n, w) = exp(S - lse) for the recomputed scores S (in place), 0 past the diagonal.
inline void recompute_probs(float* P, int64_t r0, int64_t r1, int64_t c0, int64_t c1, const float* L) {
  const int64_t w = c1 - c0;
  for (int64_t t = r0; t < r1; ++t) exp_row(P + (t - r0) * w, std::min(c1, t + 1) - c0, w, L[t]);
}

// Backward: dS = P * (dP - D) in place of dP (n, w): zero where P is (past the diagonal).
inline void softmax_grad(float* dS, const float* P, const float* D, int64_t n, int64_t w) {
  for (int64_t t = 0; t < n; ++t) {
    const float* p = P + t * w;
    float* d = dS + t * w;
    const float Dt = D[t];
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) d[j] = p[j] * (d[j] - Dt);
  }
}

}  // namespace jtok::attn
