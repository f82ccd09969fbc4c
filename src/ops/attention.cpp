#include "ops/attention.h"

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
      float* P = probs + (b * H + h) * T * T;
      gemm(false, true, T, T, hd, scale, qh, qd, kg, kvd, 0.0f, P, T);
      for (int64_t t = 0; t < T; ++t) causal_softmax_row(P + t * T, t, T);
      gemm(false, false, T, hd, T, 1.0f, P, T, vg, kvd, 0.0f, out + b * T * qd + h * hd, qd);
    }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                        const float* k, const float* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
  const int64_t qd = H * hd, kvd = KV * hd, group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Parallel over (batch, kv head): the q heads of one group write the same dk/dv rows.
#pragma omp parallel
  {
    std::vector<float> dP(static_cast<size_t>(T * T));
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
          // dV += P^T dO ; dP = dO V^T
          gemm(true, false, T, hd, T, 1.0f, P, T, dOh, qd, 1.0f, dvg, kvd);
          gemm(false, true, T, T, hd, 1.0f, dOh, qd, vg, kvd, 0.0f, dP.data(), T);
          // dS = P * (dP - sum_j P dP), computed in place in dP (upper triangle stays 0 via P = 0).
          for (int64_t t = 0; t < T; ++t) {
            const float* p = P + t * T;
            float* d = dP.data() + t * T;
            float dot = 0.0f;
            for (int64_t j = 0; j <= t; ++j) dot += p[j] * d[j];
            for (int64_t j = 0; j <= t; ++j) d[j] = p[j] * (d[j] - dot);
            for (int64_t j = t + 1; j < T; ++j) d[j] = 0.0f;
          }
          // dQ += scale dS K ; dK += scale dS^T Q
          gemm(false, false, T, hd, T, scale, dP.data(), T, kg, kvd, 1.0f, dq + b * T * qd + h * hd, qd);
          gemm(true, false, T, hd, T, scale, dP.data(), T, qh, qd, 1.0f, dkg, kvd);
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
