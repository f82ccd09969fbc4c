// Mixed-precision O(T) attention (jtok train --precision bf16): attention_forward / _backward's
// algorithm and row work (ops/attention_blocks.h), with every block product bf16 x bf16 summed in
// fp32 on tiles of our own (ops/bf16_pairs.h), as the layers' products run at that precision.
// Each operand is rounded to bf16 once, laid out in pairs along its product's contraction:
//   q, dO   rows as pairs along hd (T, hd/2)            scores and dP: the rows of A
//   K^T, V^T   (hd/2, T): pairs along hd, a key a column   scores and dP: B
//   q, dO, K, V  consecutive rows interleaved (T/2, hd)  dK, dV, dQ, out: B
//   P, dS   per block, pairs along keys (rows of A) or rows interleaved (A read transposed)
// The softmax, its maxima and sums stay fp32.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/attention.h"
#include "ops/attention_blocks.h"
#include "ops/bf16_pairs.h"

namespace jtok {
namespace {

using Pairs = std::vector<uint32_t>;

inline int64_t pairs_of(int64_t n) { return (n + 1) / 2; }

// One head's q (or dO) as both layouts: rows (T, hd/2) and interleaved rows (T/2, hd).
void pack_head(Pairs& rows, Pairs& inter, const float* x, int64_t T, int64_t hd, int64_t ld) {
  rows.resize(static_cast<size_t>(T * (hd / 2)));
  inter.resize(static_cast<size_t>(pairs_of(T) * hd));
  pack_pairs_along_rows(rows.data(), x, T, hd, ld);
  pack_row_pairs(inter.data(), hd, x, T, hd, ld);
}

}  // namespace

void attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B,
                            int64_t T, int64_t H, int64_t KV, int64_t hd) {
  const int64_t qd = H * hd, kvd = KV * hd, group = H / KV, hp = hd / 2;
  const int64_t nblocks = (T + kAttnRowBlock - 1) / kAttnRowBlock;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // q rows (B*H, T, hp); K^T (B*KV, hp, T); V rows interleaved (B*KV, T/2, hd).
  Pairs q2(static_cast<size_t>(B * H * T * hp)), kt(static_cast<size_t>(B * KV * hp * T)),
      v2(static_cast<size_t>(B * KV * pairs_of(T) * hd));
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; ++bh)
      pack_pairs_along_rows(q2.data() + bh * T * hp, q + (bh / H) * T * qd + (bh % H) * hd, T, hd, qd);
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < B * KV; ++bg) {
      const int64_t off = (bg / KV) * T * kvd + (bg % KV) * hd;
      pack_transposed_pairs(kt.data() + bg * hp * T, T, k + off, T, hd, kvd);
      pack_row_pairs(v2.data() + bg * pairs_of(T) * hd, hd, v + off, T, hd, kvd);
    }
    const int64_t wmax = std::min(kAttnKeyBlock, T);
    std::vector<float> S(static_cast<size_t>(kAttnRowBlock * wmax)), mrow(kAttnRowBlock), lrow(kAttnRowBlock);
    Pairs P2(static_cast<size_t>(kAttnRowBlock * pairs_of(wmax)));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t ib = 0; ib < nblocks; ++ib) {
        const int64_t b = bh / H, h = bh % H, bg = b * KV + h / group;
        const int64_t r0 = (nblocks - 1 - ib) * kAttnRowBlock, r1 = std::min(r0 + kAttnRowBlock, T), n = r1 - r0;
        float* oh = out + b * T * qd + h * hd;
        std::fill_n(mrow.begin(), n, -INFINITY);
        std::fill_n(lrow.begin(), n, 0.0f);
        for (int64_t c0 = 0; c0 < r1; c0 += kAttnKeyBlock) {
          const int64_t c1 = std::min(c0 + kAttnKeyBlock, r1), w = c1 - c0;
          // S (n,w) = scale Q[r0:r1] K[c0:c1]^T
          gemm_bf16_pairs(n, w, hp, scale, q2.data() + (bh * T + r0) * hp, hp, 1, kt.data() + bg * hp * T + c0, T,
                          0.0f, S.data(), w);
          attn::online_softmax_block(S.data(), r0, r1, c0, c1, mrow.data(), lrow.data(), oh, qd, hd);
          // out[r0:r1] (n,hd) (+)= exp(S) (n,w) V[c0:c1] (w,hd); c0 is even, so V's pairs start at c0 / 2
          pack_pairs_along_rows(P2.data(), S.data(), n, w, w);
          gemm_bf16_pairs(n, hd, pairs_of(w), 1.0f, P2.data(), pairs_of(w), 1,
                          v2.data() + (bg * pairs_of(T) + c0 / 2) * hd, hd, c0 == 0 ? 0.0f : 1.0f, oh + r0 * qd, qd);
        }
        attn::finish_rows(oh, lse + bh * T, r0, r1, mrow.data(), lrow.data(), qd, hd);
      }
  }
}

namespace {

// One (batch, kv head) group's operands in their pair layouts, packed by the thread that owns it.
struct GroupPairs {
  Pairs kt, vt, k2;          // K^T, V^T (hp, T); K rows interleaved (T/2, hd)
  Pairs q2, qi, do2, doi;    // the current head's q and dO: rows (T, hp), interleaved (T/2, hd)
  Pairs P2i, dS2, dS2i;      // a block's P interleaved, dS rows, dS interleaved
};

// The products of one (row block, key block) of one head; P and dS are fp32 scratch (n, w).
void backward_block(GroupPairs& g, float* P, float* dS, const float* D, const float* L, int64_t r0, int64_t r1,
                    int64_t c0, int64_t c1, int64_t T, int64_t hd, float scale, float* dqh, float* dkg, float* dvg,
                    int64_t qd, int64_t kvd) {
  const int64_t n = r1 - r0, w = c1 - c0, hp = hd / 2;
  // P (n,w) = exp(scale Q K^T - lse), recomputed; zero past the diagonal.
  gemm_bf16_pairs(n, w, hp, scale, g.q2.data() + r0 * hp, hp, 1, g.kt.data() + c0, T, 0.0f, P, w);
  attn::recompute_probs(P, r0, r1, c0, c1, L);
  // dV[c0:c1] (w,hd) += P^T (w,n) dO[r0:r1] (n,hd): P's rows interleaved, read transposed; r0 is even
  pack_row_pairs(g.P2i.data(), w, P, n, w, w);
  gemm_bf16_pairs(w, hd, pairs_of(n), 1.0f, g.P2i.data(), 1, w, g.doi.data() + (r0 / 2) * hd, hd, 1.0f,
                  dvg + c0 * kvd, kvd);
  // dP (n,w) = dO[r0:r1] V[c0:c1]^T, then dS = P * (dP - D)
  gemm_bf16_pairs(n, w, hp, 1.0f, g.do2.data() + r0 * hp, hp, 1, g.vt.data() + c0, T, 0.0f, dS, w);
  attn::softmax_grad(dS, P, D, n, w);
  // dQ[r0:r1] (n,hd) += scale dS (n,w) K[c0:c1] (w,hd)
  pack_pairs_along_rows(g.dS2.data(), dS, n, w, w);
  gemm_bf16_pairs(n, hd, pairs_of(w), scale, g.dS2.data(), pairs_of(w), 1, g.k2.data() + (c0 / 2) * hd, hd, 1.0f,
                  dqh + r0 * qd, qd);
  // dK[c0:c1] (w,hd) += scale dS^T (w,n) Q[r0:r1] (n,hd)
  pack_row_pairs(g.dS2i.data(), w, dS, n, w, w);
  gemm_bf16_pairs(w, hd, pairs_of(n), scale, g.dS2i.data(), 1, w, g.qi.data() + (r0 / 2) * hd, hd, 1.0f,
                  dkg + c0 * kvd, kvd);
}

}  // namespace

void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                             const float* q, const float* k, const float* v, int64_t B, int64_t T, int64_t H,
                             int64_t KV, int64_t hd) {
  const int64_t qd = H * hd, kvd = KV * hd, group = H / KV, hp = hd / 2;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Parallel over (batch, kv head), as the fp32 kernel: one thread owns a group's dk / dv rows and
  // accumulates them in a fixed order, so the result does not depend on the thread count.
#pragma omp parallel
  {
    const int64_t wmax = std::min(kAttnKeyBlock, T);
    std::vector<float> P(static_cast<size_t>(kAttnRowBlock * wmax)), dS(P.size()), D(kAttnRowBlock);
    GroupPairs g;
    g.kt.resize(static_cast<size_t>(hp * T));
    g.vt.resize(g.kt.size());
    g.k2.resize(static_cast<size_t>(pairs_of(T) * hd));
    g.P2i.resize(static_cast<size_t>(pairs_of(kAttnRowBlock) * wmax));
    g.dS2.resize(static_cast<size_t>(kAttnRowBlock * pairs_of(wmax)));
    g.dS2i.resize(g.P2i.size());
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t gi = 0; gi < KV; ++gi) {
        const int64_t off = b * T * kvd + gi * hd;
        pack_transposed_pairs(g.kt.data(), T, k + off, T, hd, kvd);
        pack_transposed_pairs(g.vt.data(), T, v + off, T, hd, kvd);
        pack_row_pairs(g.k2.data(), hd, k + off, T, hd, kvd);
        for (int64_t h = gi * group; h < (gi + 1) * group; ++h) {
          const int64_t hoff = b * T * qd + h * hd;
          pack_head(g.q2, g.qi, q + hoff, T, hd, qd);
          pack_head(g.do2, g.doi, dout + hoff, T, hd, qd);
          for (int64_t r0 = 0; r0 < T; r0 += kAttnRowBlock) {
            const int64_t r1 = std::min(r0 + kAttnRowBlock, T);
            attn::softmax_row_terms(D.data(), dout + hoff, out + hoff, r0, r1, qd, hd);
            for (int64_t c0 = 0; c0 < r1; c0 += kAttnKeyBlock)
              backward_block(g, P.data(), dS.data(), D.data(), lse + (b * H + h) * T, r0, r1, c0,
                             std::min(c0 + kAttnKeyBlock, r1), T, hd, scale, dq + hoff, dk + off, dv + off, qd, kvd);
          }
        }
      }
  }
}

}  // namespace jtok
