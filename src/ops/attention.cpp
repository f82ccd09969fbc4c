#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <omp.h>

#include "core/parallel.h"
#include "ops/attention_blocks.h"
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

void attention_forward_probs(float* out, float* probs, const float* q, const float* k, const float* v, int64_t B,
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
        gemm_f32(false, true, n, r1, hd, scale, qh + r0 * qd, qd, kg, kvd, 0.0f, P + r0 * T, T);
        // Reads columns 0..t only and zeroes t+1..T-1, so the stored P is exactly 0 past the diagonal.
        for (int64_t t = r0; t < r1; ++t) causal_softmax_row(P + t * T, t, T);
        // out[r0:r1] (n,hd) = P[r0:r1, 0:r1] (n,r1) V[0:r1] (r1,hd)
        gemm_f32(false, false, n, hd, r1, 1.0f, P + r0 * T, T, vg, kvd, 0.0f, oh + r0 * qd, qd);
      }
    }
}

void attention_backward_probs(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
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
            gemm_f32(true, false, r1, hd, n, 1.0f, Pb, T, dOh + r0 * qd, qd, 1.0f, dvg, kvd);
            // dP (n,r1) = dO[r0:r1] (n,hd) V[0:r1]^T (hd,r1)
            gemm_f32(false, true, n, r1, hd, 1.0f, dOh + r0 * qd, qd, vg, kvd, 0.0f, dS.data(), r1);
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
            gemm_f32(false, false, n, hd, r1, scale, dS.data(), r1, kg, kvd, 1.0f, dqh + r0 * qd, qd);
            // dK[0:r1] (r1,hd) += scale dS^T (r1,n) Q[r0:r1] (n,hd)
            gemm_f32(true, false, r1, hd, n, scale, dS.data(), r1, qh + r0 * qd, qd, 1.0f, dkg, kvd);
          }
        }
      }
  }
}

// ---- O(T) memory: FlashAttention-2's algorithm on the CPU ------------------------------------
// Per (batch, head), query row blocks of kAttnRowBlock rows; per row block, key blocks of
// kAttnKeyBlock keys up to the diagonal. A key block size that is a multiple of the row block keeps
// the block of keys [c0, c1) with c0 <= r0, so every row sees at least one key of every block.
static_assert(kAttnKeyBlock % kAttnRowBlock == 0, "key blocks must be whole multiples of row blocks");

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B, int64_t T,
                       int64_t H, int64_t KV, int64_t hd) {
  if (matmul_precision() == MatmulPrecision::bf16 && hd % 2 == 0)
    return attention_forward_bf16(out, lse, q, k, v, B, T, H, KV, hd);
  const int64_t qd = H * hd, kvd = KV * hd, group = H / KV;
  const int64_t nblocks = (T + kAttnRowBlock - 1) / kAttnRowBlock;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel
  {
    // Per thread: a score block (Br, Bc) and the running max and sum of each row of a row block.
    std::vector<float> S(static_cast<size_t>(kAttnRowBlock * std::min(kAttnKeyBlock, T)));
    std::vector<float> mrow(kAttnRowBlock), lrow(kAttnRowBlock);
    // One (batch, head, row block) per task, the costly (late) row blocks first.
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t ib = 0; ib < nblocks; ++ib) {
        const int64_t b = bh / H, h = bh % H, g = h / group;
        const int64_t r0 = (nblocks - 1 - ib) * kAttnRowBlock, r1 = std::min(r0 + kAttnRowBlock, T), n = r1 - r0;
        const float* qh = q + b * T * qd + h * hd;
        const float* kg = k + b * T * kvd + g * hd;
        const float* vg = v + b * T * kvd + g * hd;
        float* oh = out + b * T * qd + h * hd;
        std::fill_n(mrow.begin(), n, -INFINITY);
        std::fill_n(lrow.begin(), n, 0.0f);
        for (int64_t c0 = 0; c0 < r1; c0 += kAttnKeyBlock) {
          const int64_t c1 = std::min(c0 + kAttnKeyBlock, r1), w = c1 - c0;
          // S (n,w) = scale Q[r0:r1] (n,hd) K[c0:c1]^T (hd,w)
          gemm_f32(false, true, n, w, hd, scale, qh + r0 * qd, qd, kg + c0 * kvd, kvd, 0.0f, S.data(), w);
          attn::online_softmax_block(S.data(), r0, r1, c0, c1, mrow.data(), lrow.data(), oh, qd, hd);
          // out[r0:r1] (n,hd) (+)= exp(S) (n,w) V[c0:c1] (w,hd)
          gemm_f32(false, false, n, hd, w, 1.0f, S.data(), w, vg + c0 * kvd, kvd, c0 == 0 ? 0.0f : 1.0f, oh + r0 * qd, qd);
        }
        attn::finish_rows(oh, lse + bh * T, r0, r1, mrow.data(), lrow.data(), qd, hd);
      }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                        const float* q, const float* k, const float* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                        int64_t hd) {
  if (matmul_precision() == MatmulPrecision::bf16 && hd % 2 == 0)
    return attention_backward_bf16(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd);
  const int64_t qd = H * hd, kvd = KV * hd, group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Parallel over (batch, kv head): the q heads of one group write the same dk/dv rows, so one
  // thread owns them and accumulates in a fixed order (heads, row blocks, key blocks): deterministic.
#pragma omp parallel
  {
    const int64_t wmax = std::min(kAttnKeyBlock, T);
    std::vector<float> P(static_cast<size_t>(kAttnRowBlock * wmax)), dS(P.size()), D(kAttnRowBlock);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < KV; ++g) {
        const float* kg = k + b * T * kvd + g * hd;
        const float* vg = v + b * T * kvd + g * hd;
        float* dkg = dk + b * T * kvd + g * hd;
        float* dvg = dv + b * T * kvd + g * hd;
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const float* dOh = dout + b * T * qd + h * hd;
          const float* qh = q + b * T * qd + h * hd;
          float* dqh = dq + b * T * qd + h * hd;
          for (int64_t r0 = 0; r0 < T; r0 += kAttnRowBlock) {
            const int64_t r1 = std::min(r0 + kAttnRowBlock, T), n = r1 - r0;
            attn::softmax_row_terms(D.data(), dOh, out + b * T * qd + h * hd, r0, r1, qd, hd);
            for (int64_t c0 = 0; c0 < r1; c0 += kAttnKeyBlock) {
              const int64_t c1 = std::min(c0 + kAttnKeyBlock, r1), w = c1 - c0;
              // P (n,w) = exp(scale Q K^T - lse), recomputed; zero past the diagonal.
              gemm_f32(false, true, n, w, hd, scale, qh + r0 * qd, qd, kg + c0 * kvd, kvd, 0.0f, P.data(), w);
              attn::recompute_probs(P.data(), r0, r1, c0, c1, lse + (b * H + h) * T);
              // dV[c0:c1] (w,hd) += P^T (w,n) dO[r0:r1] (n,hd)
              gemm_f32(true, false, w, hd, n, 1.0f, P.data(), w, dOh + r0 * qd, qd, 1.0f, dvg + c0 * kvd, kvd);
              // dP (n,w) = dO[r0:r1] (n,hd) V[c0:c1]^T (hd,w)
              gemm_f32(false, true, n, w, hd, 1.0f, dOh + r0 * qd, qd, vg + c0 * kvd, kvd, 0.0f, dS.data(), w);
              attn::softmax_grad(dS.data(), P.data(), D.data(), n, w);
              // dQ[r0:r1] (n,hd) += scale dS (n,w) K[c0:c1] (w,hd)
              gemm_f32(false, false, n, hd, w, scale, dS.data(), w, kg + c0 * kvd, kvd, 1.0f, dqh + r0 * qd, qd);
              // dK[c0:c1] (w,hd) += scale dS^T (w,n) Q[r0:r1] (n,hd)
              gemm_f32(true, false, w, hd, n, scale, dS.data(), w, qh + r0 * qd, qd, 1.0f, dkg + c0 * kvd, kvd);
            }
          }
        }
      }
  }
}

void attention_forward_ref(float* out, float* probs, const float* q, const float* k, const float* v, int64_t B,
                           int64_t T, int64_t H, int64_t KV, int64_t hd, float* lse) {
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
        if (lse) lse[(b * H + h) * T + t] = static_cast<float>(mx + std::log(sum));
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

}  // namespace jtok
