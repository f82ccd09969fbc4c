#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <omp.h>

#include "ops/fast_exp.h"
#include "ops/linear.h"

namespace jtok {

// In-place causal softmax of row t of a (T,T) score block: columns 0..t, zeros after.
static inline void causal_softmax_row(float* row, int64_t t, int64_t T) {
  float mx = row[0];
#pragma omp simd reduction(max : mx)
  for (int64_t j = 1; j <= t; ++j) mx = row[j] > mx ? row[j] : mx;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j <= t; ++j) {
    float e = fast_expf(row[j] - mx);
    row[j] = e;
    sum += e;
  }
  float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t j = 0; j <= t; ++j) row[j] *= inv;
  for (int64_t j = t + 1; j < T; ++j) row[j] = 0.0f;
}

void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v, int64_t B,
                       int64_t T, int64_t H, int64_t KV, int64_t hd) {
  const int64_t qd = H * hd, kvd = KV * hd, group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // One (batch, head) per task; oneDNN runs single-threaded inside the parallel region.
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      const float* qh = q + b * T * qd + h * hd;
      const float* kg = k + b * T * kvd + g * hd;
      const float* vg = v + b * T * kvd + g * hd;
      float* oh = out + b * T * qd + h * hd;
      float* P = probs + (b * H + h) * T * T;
      for (int64_t r0 = 0; r0 < T; r0 += kAttnRowBlock) {
        const int64_t r1 = std::min(r0 + kAttnRowBlock, T), n = r1 - r0;
        // P[r0:r1, 0:r1] (n,r1) = scale Q[r0:r1] (n,hd) K[0:r1]^T (hd,r1)
        gemm(false, true, n, r1, hd, scale, qh + r0 * qd, qd, kg, kvd, 0.0f, P + r0 * T, T);
        // Reads columns 0..t only and zeroes t+1..T-1, so the stored P is exactly 0 past the diagonal.
        for (int64_t t = r0; t < r1; ++t) causal_softmax_row(P + t * T, t, T);
        // out[r0:r1] (n,hd) = P[r0:r1, 0:r1] (n,r1) V[0:r1] (r1,hd)
        gemm(false, false, n, hd, r1, 1.0f, P + r0 * T, T, vg, kvd, 0.0f, oh + r0 * qd, qd);
      }
    }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                        const float* k, const float* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
  const int64_t qd = H * hd, kvd = KV * hd, group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Parallel over (batch, kv head): the q heads of one group write the same dk/dv rows, so one
  // thread owns them and accumulates in a fixed order (heads, then row blocks): deterministic.
#pragma omp parallel
  {
    // dS of one row block: (n, r1) with row stride r1, at most (R, T).
    std::vector<float> dS(static_cast<size_t>(std::min(kAttnRowBlock, T) * T));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < KV; ++g) {
        const float* kg = k + b * T * kvd + g * hd;
        const float* vg = v + b * T * kvd + g * hd;
        float* dkg = dk + b * T * kvd + g * hd;
        float* dvg = dv + b * T * kvd + g * hd;
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const float* P = probs + (b * H + h) * T * T;
          const float* dOh = dout + b * T * qd + h * hd;
          const float* qh = q + b * T * qd + h * hd;
          float* dqh = dq + b * T * qd + h * hd;
          for (int64_t r0 = 0; r0 < T; r0 += kAttnRowBlock) {
            const int64_t r1 = std::min(r0 + kAttnRowBlock, T), n = r1 - r0;
            const float* Pb = P + r0 * T;  // P[r0:r1, 0:r1], row stride T
            // dV[0:r1] (r1,hd) += P[r0:r1, 0:r1]^T (r1,n) dO[r0:r1] (n,hd)
            gemm(true, false, r1, hd, n, 1.0f, Pb, T, dOh + r0 * qd, qd, 1.0f, dvg, kvd);
            // dP (n,r1) = dO[r0:r1] (n,hd) V[0:r1]^T (hd,r1)
            gemm(false, true, n, r1, hd, 1.0f, dOh + r0 * qd, qd, vg, kvd, 0.0f, dS.data(), r1);
            // dS = P * (dP - sum_j P dP) in place; zero past the diagonal inside the block, which
            // the GEMMs below read.
            for (int64_t t = r0; t < r1; ++t) {
              const float* p = P + t * T;
              float* d = dS.data() + (t - r0) * r1;
              float dot = 0.0f;
              for (int64_t j = 0; j <= t; ++j) dot += p[j] * d[j];
              for (int64_t j = 0; j <= t; ++j) d[j] = p[j] * (d[j] - dot);
              for (int64_t j = t + 1; j < r1; ++j) d[j] = 0.0f;
            }
            // dQ[r0:r1] (n,hd) += scale dS (n,r1) K[0:r1] (r1,hd)
            gemm(false, false, n, hd, r1, scale, dS.data(), r1, kg, kvd, 1.0f, dqh + r0 * qd, qd);
            // dK[0:r1] (r1,hd) += scale dS^T (r1,n) Q[r0:r1] (n,hd)
            gemm(true, false, r1, hd, n, scale, dS.data(), r1, qh + r0 * qd, qd, 1.0f, dkg, kvd);
          }
        }
      }
  }
}

void attention_forward_ref(float* out, float* probs, const float* q, const float* k, const float* v, int64_t B,
                           int64_t T, int64_t H, int64_t KV, int64_t hd) {
  const int64_t qd = H * hd, kvd = KV * hd, group = H / KV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> s(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      for (int64_t t = 0; t < T; ++t) {
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double acc = 0;
          for (int64_t i = 0; i < hd; ++i) acc += static_cast<double>(q[(b * T + t) * qd + h * hd + i]) * k[(b * T + j) * kvd + g * hd + i];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= t; ++j) sum += (s[j] = std::exp(s[j] - mx));
        float* P = probs + ((b * H + h) * T + t) * T;
        for (int64_t j = 0; j < T; ++j) P[j] = j <= t ? static_cast<float>(s[j] / sum) : 0.0f;
        for (int64_t i = 0; i < hd; ++i) {
          double acc = 0;
          for (int64_t j = 0; j <= t; ++j) acc += s[j] / sum * v[(b * T + j) * kvd + g * hd + i];
          out[(b * T + t) * qd + h * hd + i] = static_cast<float>(acc);
        }
      }
    }
}

void attention_backward_ref(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                            const float* k, const float* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
  const int64_t qd = H * hd, kvd = KV * hd, group = H / KV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> dp(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      for (int64_t t = 0; t < T; ++t) {
        const float* P = probs + ((b * H + h) * T + t) * T;
        const float* dO = dout + (b * T + t) * qd + h * hd;
        double dot = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double acc = 0;
          for (int64_t i = 0; i < hd; ++i) {
            acc += static_cast<double>(dO[i]) * v[(b * T + j) * kvd + g * hd + i];
            dv[(b * T + j) * kvd + g * hd + i] += static_cast<float>(P[j] * dO[i]);
          }
          dp[j] = acc;
          dot += P[j] * acc;
        }
        for (int64_t j = 0; j <= t; ++j) {
          double ds = P[j] * (dp[j] - dot) * scale;
          for (int64_t i = 0; i < hd; ++i) {
            dq[(b * T + t) * qd + h * hd + i] += static_cast<float>(ds * k[(b * T + j) * kvd + g * hd + i]);
            dk[(b * T + j) * kvd + g * hd + i] += static_cast<float>(ds * q[(b * T + t) * qd + h * hd + i]);
          }
        }
      }
    }
}

void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache, int64_t t, int64_t H,
                      int64_t KV, int64_t hd, float* scratch) {
  const int64_t kvd = KV * hd, group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / group;
    const float* qh = q + h * hd;
    float mx = -INFINITY;
    for (int64_t j = 0; j <= t; ++j) {
      const float* kj = k_cache + j * kvd + g * hd;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < hd; ++i) acc += qh[i] * kj[i];
      scratch[j] = acc * scale;
      mx = std::max(mx, scratch[j]);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j <= t; ++j) sum += (scratch[j] = fast_expf(scratch[j] - mx));
    float* oh = out + h * hd;
    for (int64_t i = 0; i < hd; ++i) oh[i] = 0.0f;
    for (int64_t j = 0; j <= t; ++j) {
      const float w = scratch[j] / sum;
      const float* vj = v_cache + j * kvd + g * hd;
#pragma omp simd
      for (int64_t i = 0; i < hd; ++i) oh[i] += w * vj[i];
    }
  }
}

}  // namespace jtok
