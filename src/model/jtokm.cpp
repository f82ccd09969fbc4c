#include "model/jtokm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "model/jtokm_mix.h"
#include "model/top_k.h"
#include "ops/linear.h"

namespace jtok {

JTokMHyper jtokm_hyper(const ModelConfig& c) {
  JTokMHyper h;
  h.n_e = c.jtokm_n_e;
  h.K = c.jtokm_top_k;
  h.c = c.jtokm_depth_scaling ? static_cast<float>(1.0 / std::sqrt(2.0 * static_cast<double>(c.num_hidden_layers))) : 1.0f;
  h.eps = static_cast<float>(c.jtokm_eps);
  h.norm = c.jtokm_norm;
  h.lambda = c.jtokm_aux_loss_coef;
  return h;
}

double jtokm_aux_loss(const double* prob_sum, const double* load, int64_t N, const JTokMHyper& hp) {
  double pn = 0;
  for (int64_t i = 0; i < hp.n_e; ++i) pn += prob_sum[i] * load[i];
  return hp.lambda * static_cast<double>(hp.n_e) / (static_cast<double>(N) * N * hp.K) * pn;
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// The local path of the forward: gathers each (unique id, table) pair some position selected once,
// then mixes e (N, d) = sum_k w_k E_{sel_k}[x] in k order.
static void gather_and_mix(JTokMActs& A, const TokenTable* E, const RowBatch& rb, int64_t N, int64_t d,
                           const JTokMHyper& hp, const RowSync& sync, int64_t table_base) {
  const int64_t ne = hp.n_e, K = hp.K, U = static_cast<int64_t>(rb.unique.size());
  // Which (unique id, table) pairs are needed: each gathered once.
  A.slot.assign(static_cast<size_t>(U * ne), -1);
  A.slot_u.clear();
  A.slot_table.clear();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t u = rb.inverse[n];
    for (int64_t k = 0; k < K; ++k) {
      int32_t& sl = A.slot[static_cast<size_t>(u * ne + A.sel[n * K + k])];
      if (sl >= 0) continue;
      sl = static_cast<int32_t>(A.slot_u.size());
      A.slot_u.push_back(static_cast<int32_t>(u));
      A.slot_table.push_back(A.sel[n * K + k]);
    }
  }
  const int64_t S = static_cast<int64_t>(A.slot_u.size());
  A.rows.resize(static_cast<size_t>(S * d));
#pragma omp parallel for schedule(static) if (S * d >= kParallelMin)  // a decoding step's few rows: serial
  for (int64_t q = 0; q < S; ++q) {
    const int32_t t = A.slot_table[q];  // f32, whatever the table's dtype
    gather_rows(A.rows.data() + q * d, E[t], &rb.unique[static_cast<size_t>(A.slot_u[q])], 1, sync, table_base + t);
  }
  // Mix.
#pragma omp parallel for schedule(static) if (N * d >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t u = rb.inverse[n];
    const int32_t* sel = A.sel.data() + n * K;
    mix_position(A.e.data() + n * d, [&](int64_t k) { return A.rows.data() + static_cast<int64_t>(A.slot[u * ne + sel[k]]) * d; },
                 A.w.data() + n * K, K, d);
  }
}

void jtokm_route(JTokMActs& A, const float* a, const float* R, const RowBatch& rb, int64_t N, int64_t d,
                 const JTokMHyper& hp, int64_t table_base, TableProvider* provider) {
  const int64_t ne = hp.n_e, K = hp.K;
  A.logits.resize(static_cast<size_t>(N * ne));
  A.sig.resize(static_cast<size_t>(N * ne));
  A.sel.resize(static_cast<size_t>(N * K));
  A.w.resize(static_cast<size_t>(N * K));
  // Router: g (N, n_e) = a (N,d) @ R^T.
  if (A.router_rows == RowKernel::per_row)
    linear_forward_lowp(A.logits.data(), a, {Dtype::f32, R, nullptr, ne, d}, N, false, RowKernel::per_row);
  else
    gemm(false, true, N, ne, d, 1.0f, a, d, R, d, 0.0f, A.logits.data(), ne);
#pragma omp parallel for schedule(static) if (N * d >= kParallelMin)  // as the gemm's rows: serial when decoding
  for (int64_t n = 0; n < N; ++n) {
    const float* g = A.logits.data() + n * ne;
    float* sg = A.sig.data() + n * ne;
    for (int64_t i = 0; i < ne; ++i) sg[i] = sigmoidf(g[i]);
    int32_t* sel = A.sel.data() + n * K;
    top_k_lower_index(sel, g, ne, K);
    float sum = 0.0f;
    for (int64_t k = 0; k < K; ++k) sum += sg[sel[k]];
    for (int64_t k = 0; k < K; ++k) A.w[static_cast<size_t>(n * K + k)] = sg[sel[k]] / sum;
  }
  // Load statistics and the aux loss (serial: N * n_e adds, in a fixed order).
  A.load.assign(static_cast<size_t>(ne), 0.0);
  A.prob_sum.assign(static_cast<size_t>(ne), 0.0);
  A.weight_sum.assign(static_cast<size_t>(ne), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const float* sg = A.sig.data() + n * ne;
    double all = 0;
    for (int64_t i = 0; i < ne; ++i) all += sg[i];
    for (int64_t i = 0; i < ne; ++i) A.prob_sum[i] += sg[i] / all;
    for (int64_t k = 0; k < K; ++k) {
      A.load[A.sel[n * K + k]] += 1.0;
      A.weight_sum[A.sel[n * K + k]] += A.w[n * K + k];
    }
  }
  A.aux = jtokm_aux_loss(A.prob_sum.data(), A.load.data(), N, hp);
  if (provider) {  // the rows' owners may start mixing now, while attention and the MLP run
    A.pos_ids.resize(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) A.pos_ids[n] = rb.unique[rb.inverse[n]];
    provider->mix_post(table_base, A.pos_ids.data(), A.sel.data(), A.w.data(), N, K);
  }
}

void jtokm_mix_inject(float* h_next, JTokMActs& A, const float* s, const TokenTable* E, const RowBatch& rb, int64_t N,
                      int64_t d, const JTokMHyper& hp, const RowSync& sync, int64_t table_base, TableProvider* provider) {
  const int64_t K = hp.K;
  A.e.resize(static_cast<size_t>(N * d));
  A.inv_norm.resize(static_cast<size_t>(N));
  if (provider) {  // the owners of the rows mix them (embedding parallelism): e comes back whole
    provider->mix(A.e.data(), table_base, A.pos_ids.data(), A.sel.data(), A.w.data(), N, K);
    A.slot.clear();
    A.slot_u.clear();
    A.slot_table.clear();
    A.rows.clear();
  } else {
    gather_and_mix(A, E, rb, N, d, hp, sync, table_base);
  }
  // Normalise, inject.
#pragma omp parallel for schedule(static) if (N * d >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* e = A.e.data() + n * d;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < d; ++j) ss += e[j] * e[j];
    const float inv = hp.norm ? 1.0f / (std::sqrt(ss) + hp.eps) : 1.0f;
    A.inv_norm[n] = inv;
    const float ci = hp.c * inv;
    float* h = h_next + n * d;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) h[j] += ci * s[j] * e[j];
  }
}

void jtokm_forward(float* h_next, JTokMActs& A, const float* a, const float* R, const float* s, const TokenTable* E,
                   const RowBatch& rb, int64_t N, int64_t d, const JTokMHyper& hp, const RowSync& sync,
                   int64_t table_base, TableProvider* provider) {
  jtokm_route(A, a, R, rb, N, d, hp, table_base, provider);
  jtokm_mix_inject(h_next, A, s, E, rb, N, d, hp, sync, table_base, provider);
}

void jtokm_backward_de(float* ds, JTokMActs& A, const float* dh, const float* s, int64_t N, int64_t d,
                       const JTokMHyper& hp, TableProvider* provider, int64_t table_base) {
  A.de.resize(static_cast<size_t>(N * d));
  const int nt = omp_get_max_threads();
  std::vector<float> ds_part(static_cast<size_t>(nt * d), 0.0f);
  // dL/de per position (and the scaler's gradient).
#pragma omp parallel
  {
    float* dsp = ds_part.data() + static_cast<int64_t>(omp_get_thread_num()) * d;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* e = A.e.data() + n * d;
      const float* g = dh + n * d;
      float* de = A.de.data() + n * d;
      const float inv = A.inv_norm[n];
      float dot = 0.0f, ss = 0.0f;
#pragma omp simd reduction(+ : dot, ss)
      for (int64_t j = 0; j < d; ++j) {
        dsp[j] += hp.c * inv * g[j] * e[j];
        de[j] = hp.c * s[j] * g[j];  // dL/dNorm(e)
        dot += e[j] * de[j];
        ss += e[j] * e[j];
      }
      if (hp.norm) {  // through Norm: de = dn / (r + eps) - e (e . dn) / (r (r + eps)^2)
        const float r = std::sqrt(ss);
        const float cf = r > 0.0f ? dot * inv * inv / r : 0.0f;
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) de[j] = de[j] * inv - e[j] * cf;
      }
    }
  }
  for (int t = 0; t < nt; ++t)
    for (int64_t j = 0; j < d; ++j) ds[j] += ds_part[static_cast<size_t>(t * d + j)];
  if (provider) provider->mix_backward_post(table_base, A.de.data(), N, hp.K);  // the owners may start now
}

namespace {

// dL/dp_t^(i) of the aux loss: the same for every token. (n_e)
std::vector<float> aux_prob_grad(const JTokMActs& A, int64_t N, const JTokMHyper& hp, float aux_grad) {
  const int64_t ne = hp.n_e, K = hp.K;
  std::vector<float> dp(static_cast<size_t>(ne));
  for (int64_t i = 0; i < ne; ++i)
    dp[i] = static_cast<float>(aux_grad * hp.lambda * static_cast<double>(ne) * A.load[i] /
                               (static_cast<double>(N) * N * K));
  return dp;
}

// Mixing weights: dw_k = de . E_k[x] (N, K), from the gathered rows or from the rows' owners.
std::vector<float> mixing_weight_grad(const JTokMActs& A, const RowBatch& rb, int64_t N, int64_t d,
                                      const JTokMHyper& hp, TableProvider* provider, int64_t table_base) {
  const int64_t ne = hp.n_e, K = hp.K;
  std::vector<float> dw(static_cast<size_t>(N * K));
  if (provider) {
    provider->mix_backward(dw.data(), table_base, A.de.data(), N, K);
    return dw;
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t u = rb.inverse[n];
    const int32_t* sel = A.sel.data() + n * K;
    mix_position_dw(dw.data() + n * K, A.de.data() + n * d,
                    [&](int64_t k) { return A.rows.data() + static_cast<int64_t>(A.slot[u * ne + sel[k]]) * d; }, K, d);
  }
  return dw;
}

// Router logits' gradient dg (N, n_e): w_k = sig_k / sum_G sig, and the aux loss's p_i = sig_i / sum_all sig.
std::vector<float> router_logit_grad(const JTokMActs& A, const std::vector<float>& dw, const std::vector<float>& dp,
                                     int64_t N, const JTokMHyper& hp) {
  const int64_t ne = hp.n_e, K = hp.K;
  std::vector<float> dg(static_cast<size_t>(N * ne));
#pragma omp parallel
  {
    std::vector<float> dsig(static_cast<size_t>(ne));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const int32_t* sel = A.sel.data() + n * K;
      const float* wk = A.w.data() + n * K;
      const float* dwn = dw.data() + n * K;
      const float* sg = A.sig.data() + n * ne;
      float ssel = 0.0f, wdw = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        ssel += sg[sel[k]];
        wdw += wk[k] * dwn[k];
      }
      float sall = 0.0f, pdp = 0.0f;
      for (int64_t i = 0; i < ne; ++i) sall += sg[i];
      for (int64_t i = 0; i < ne; ++i) pdp += sg[i] / sall * dp[i];
      for (int64_t i = 0; i < ne; ++i) dsig[i] = (dp[i] - pdp) / sall;
      for (int64_t k = 0; k < K; ++k) dsig[sel[k]] += (dwn[k] - wdw) / ssel;
      float* dgn = dg.data() + n * ne;
      for (int64_t i = 0; i < ne; ++i) dgn[i] = dsig[i] * sg[i] * (1.0f - sg[i]);
    }
  }
  return dg;
}

// Tables: each gathered (u, i) row collects w * de over the positions of u that selected i.
void table_row_grads(SparseRowGrad* gE, const JTokMActs& A, const RowBatch& rb, int64_t d, const JTokMHyper& hp) {
  const int64_t ne = hp.n_e, K = hp.K, U = static_cast<int64_t>(rb.unique.size());
  const int64_t S = static_cast<int64_t>(A.slot_u.size());
  std::vector<float*> grow(static_cast<size_t>(S));
  for (int64_t q = 0; q < S; ++q) gE[A.slot_table[q]].row(rb.unique[A.slot_u[q]]);  // create first (may reallocate)
  for (int64_t q = 0; q < S; ++q) grow[q] = gE[A.slot_table[q]].row(rb.unique[A.slot_u[q]]);
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t u = 0; u < U; ++u) {
    for (int32_t p = rb.offsets[u]; p < rb.offsets[u + 1]; ++p) {
      const int64_t n = rb.order[p];
      const float* de = A.de.data() + n * d;
      for (int64_t k = 0; k < K; ++k) {
        float* out = grow[A.slot[u * ne + A.sel[n * K + k]]];
        const float wk = A.w[n * K + k];
        mix_term_grad(out, wk, de, d);
      }
    }
  }
}

}  // namespace

void jtokm_backward_router(float* da, float* dR, SparseRowGrad* gE, JTokMActs& A, const float* a, const float* R,
                           const RowBatch& rb, int64_t N, int64_t d, const JTokMHyper& hp, float aux_grad,
                           TableProvider* provider, int64_t table_base) {
  const int64_t ne = hp.n_e;
  const std::vector<float> dp = aux_prob_grad(A, N, hp, aux_grad);
  const std::vector<float> dw = mixing_weight_grad(A, rb, N, d, hp, provider, table_base);
  const std::vector<float> dg = router_logit_grad(A, dw, dp, N, hp);
  // Router: dR (n_e,d) += dg^T a; da (N,d) += dg R.
  gemm(true, false, ne, d, N, 1.0f, dg.data(), ne, a, d, 1.0f, dR, d);
  gemm(false, false, N, d, ne, 1.0f, dg.data(), ne, R, d, 1.0f, da, d);
  if (provider) return;  // the owners accumulated the tables' gradients
  table_row_grads(gE, A, rb, d, hp);
}

void jtokm_backward(float* da, float* dR, float* ds, SparseRowGrad* gE, JTokMActs& A, const float* dh, const float* a,
                    const float* R, const float* s, const RowBatch& rb, int64_t N, int64_t d, const JTokMHyper& hp,
                    float aux_grad, TableProvider* provider, int64_t table_base) {
  jtokm_backward_de(ds, A, dh, s, N, d, hp, provider, table_base);
  jtokm_backward_router(da, dR, gE, A, a, R, rb, N, d, hp, aux_grad, provider, table_base);
}

// ---- references ----

namespace {
// One position's routing in double: logits, sigmoids, selection, weights.
struct RefRoute {
  std::vector<double> g, sg, w;
  std::vector<int32_t> sel;
};
RefRoute ref_route(const float* a, const float* R, int64_t d, const JTokMHyper& hp) {
  RefRoute r;
  r.g.resize(hp.n_e);
  r.sg.resize(hp.n_e);
  std::vector<float> gf(hp.n_e);
  for (int64_t i = 0; i < hp.n_e; ++i) {
    double acc = 0;
    for (int64_t j = 0; j < d; ++j) acc += static_cast<double>(a[j]) * R[i * d + j];
    r.g[i] = acc;
    gf[i] = static_cast<float>(acc);
    r.sg[i] = 1.0 / (1.0 + std::exp(-acc));
  }
  r.sel.resize(hp.K);
  top_k_lower_index(r.sel.data(), gf.data(), hp.n_e, hp.K);
  double sum = 0;
  for (auto i : r.sel) sum += r.sg[i];
  for (auto i : r.sel) r.w.push_back(r.sg[i] / sum);
  return r;
}
}  // namespace

double jtokm_forward_ref(float* out, const float* a, const float* R, const float* s, const TokenTable* E,
                         const int32_t* ids, int64_t N, int64_t d, const JTokMHyper& hp) {
  std::vector<double> P(hp.n_e, 0.0), load(hp.n_e, 0.0), e(d);
  for (int64_t n = 0; n < N; ++n) {
    RefRoute r = ref_route(a + n * d, R, d, hp);
    double all = 0;
    for (double x : r.sg) all += x;
    for (int64_t i = 0; i < hp.n_e; ++i) P[i] += r.sg[i] / all;
    std::fill(e.begin(), e.end(), 0.0);
    for (int64_t k = 0; k < hp.K; ++k) {
      load[r.sel[k]] += 1;
      const float* row = E[r.sel[k]].row(ids[n]);
      for (int64_t j = 0; j < d; ++j) e[j] += r.w[k] * row[j];
    }
    double ss = 0;
    for (double x : e) ss += x * x;
    const double inv = hp.norm ? 1.0 / (std::sqrt(ss) + hp.eps) : 1.0;
    for (int64_t j = 0; j < d; ++j) out[n * d + j] = static_cast<float>(out[n * d + j] + hp.c * s[j] * e[j] * inv);
  }
  double pn = 0;
  for (int64_t i = 0; i < hp.n_e; ++i) pn += P[i] * load[i];
  return hp.lambda * static_cast<double>(hp.n_e) / (static_cast<double>(N) * N * hp.K) * pn;
}

void jtokm_backward_ref(float* da, float* dR, float* ds, std::vector<std::vector<float>>& dE, const float* dh,
                        const float* a, const float* R, const float* s, const TokenTable* E, const int32_t* ids,
                        int64_t N, int64_t d, const JTokMHyper& hp, float aux_grad) {
  const int64_t ne = hp.n_e, K = hp.K;
  std::vector<double> load(ne, 0.0);
  std::vector<RefRoute> routes;
  for (int64_t n = 0; n < N; ++n) {
    routes.push_back(ref_route(a + n * d, R, d, hp));
    for (auto i : routes.back().sel) load[i] += 1;
  }
  std::vector<double> e(d), dn(d), de(d), dsig(ne);
  for (int64_t n = 0; n < N; ++n) {
    const RefRoute& r = routes[n];
    std::fill(e.begin(), e.end(), 0.0);
    for (int64_t k = 0; k < K; ++k) {
      const float* row = E[r.sel[k]].row(ids[n]);
      for (int64_t j = 0; j < d; ++j) e[j] += r.w[k] * row[j];
    }
    double ss = 0;
    for (double x : e) ss += x * x;
    const double rn = std::sqrt(ss), inv = hp.norm ? 1.0 / (rn + hp.eps) : 1.0;
    double dot = 0;
    for (int64_t j = 0; j < d; ++j) {
      const double g = dh[n * d + j];
      ds[j] = static_cast<float>(ds[j] + hp.c * g * e[j] * inv);
      dn[j] = hp.c * s[j] * g;
      dot += dn[j] * e[j];
    }
    for (int64_t j = 0; j < d; ++j) de[j] = hp.norm ? dn[j] * inv - (rn > 0 ? e[j] * dot * inv * inv / rn : 0.0) : dn[j];
    double ssel = 0, wdw = 0, all = 0;
    std::vector<double> dw(K);
    for (int64_t k = 0; k < K; ++k) {
      const float* row = E[r.sel[k]].row(ids[n]);
      double acc = 0;
      for (int64_t j = 0; j < d; ++j) acc += de[j] * row[j];
      dw[k] = acc;
      ssel += r.sg[r.sel[k]];
      wdw += r.w[k] * acc;
      float* out = dE[r.sel[k]].data() + static_cast<int64_t>(ids[n]) * d;
      for (int64_t j = 0; j < d; ++j) out[j] = static_cast<float>(out[j] + r.w[k] * de[j]);
    }
    for (double x : r.sg) all += x;
    double pdp = 0;
    std::vector<double> dp(ne);
    for (int64_t i = 0; i < ne; ++i) {
      dp[i] = aux_grad * hp.lambda * static_cast<double>(ne) * load[i] / (static_cast<double>(N) * N * K);
      pdp += r.sg[i] / all * dp[i];
    }
    for (int64_t i = 0; i < ne; ++i) dsig[i] = (dp[i] - pdp) / all;
    for (int64_t k = 0; k < K; ++k) dsig[r.sel[k]] += (dw[k] - wdw) / ssel;
    for (int64_t i = 0; i < ne; ++i) {
      const double dgi = dsig[i] * r.sg[i] * (1 - r.sg[i]);
      for (int64_t j = 0; j < d; ++j) {
        dR[i * d + j] = static_cast<float>(dR[i * d + j] + dgi * a[n * d + j]);
        da[n * d + j] = static_cast<float>(da[n * d + j] + dgi * R[i * d + j]);
      }
    }
  }
}

}  // namespace jtok
