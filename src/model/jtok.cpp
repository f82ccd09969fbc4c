#include "model/jtok.h"

#include <omp.h>

#include <cmath>

#include "core/parallel.h"

namespace jtok {

void jtok_prepare(JTokActs& a, const TokenTable& E, const RowBatch& rb, float eps, bool norm, const RowSync& sync,
                  int64_t table, TableProvider* provider) {
  const int64_t U = static_cast<int64_t>(rb.unique.size()), d = E.dim;
  a.rows.resize(static_cast<size_t>(U * d));
  a.nrows.resize(static_cast<size_t>(U * d));
  a.inv_norm.resize(static_cast<size_t>(U));
  if (provider) provider->rows(a.rows.data(), table, rb);
  else gather_unique_rows(a.rows.data(), E, rb, sync, table);
  // A decoding step has one row per sequence: serial (kParallelMin), as each element's value does
  // not depend on the thread that computes it.
#pragma omp parallel for schedule(static) if (U * d >= kParallelMin)
  for (int64_t u = 0; u < U; ++u) {
    const float* e = a.rows.data() + u * d;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < d; ++j) ss += e[j] * e[j];
    const float inv = norm ? 1.0f / (std::sqrt(ss) + eps) : 1.0f;
    a.inv_norm[u] = inv;
    float* ne = a.nrows.data() + u * d;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) ne[j] = e[j] * inv;
  }
}

bool jtok_gate_is_one(const float* s, int64_t d) {
  for (int64_t j = 0; j < d; ++j)
    if (s[j] != 0.0f) return false;
  return true;
}

void jtok_forward(float* h_next, const float* h_mid, const JTokActs& a, const float* s, const RowBatch& rb, int64_t N,
                  int64_t d) {
#pragma omp parallel for schedule(static) if (N * d >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* ne = a.nrows.data() + static_cast<int64_t>(rb.inverse[n]) * d;
    const float* mo = a.mlp_out.data() + n * d;
    const float* hm = h_mid + n * d;
    float* hn = h_next + n * d;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) hn[j] = hm[j] + mo[j] * (1.0f + s[j] * ne[j]);
  }
}

// Per unique row u with positions P(u): sdp = sum_{n in P(u)} dh_n * mlp_out_n (= dL/dp summed),
// ds += sdp * nE_u, dnE = sdp * s, and through the norm
//   dE = dnE / (r + eps) - E (E . dnE) / (r (r + eps)^2),  r = ||E||.
void jtok_backward(float* dmlp, float* ds, SparseRowGrad& gE, const float* dh, const JTokActs& a, const float* s,
                   const RowBatch& rb, int64_t N, int64_t d, bool norm) {
  const int64_t U = static_cast<int64_t>(rb.unique.size());
  // Serial: create the rows first (creation may reallocate), then take stable pointers.
  for (int64_t u = 0; u < U; ++u) gE.row(rb.unique[u]);
  std::vector<float*> grow(static_cast<size_t>(U));
  for (int64_t u = 0; u < U; ++u) grow[u] = gE.row(rb.unique[u]);
  const int nt = omp_get_max_threads();
  std::vector<float> ds_part(static_cast<size_t>(nt * d), 0.0f);
#pragma omp parallel
  {
    std::vector<float> sdp(static_cast<size_t>(d));
    float* dsp = ds_part.data() + static_cast<int64_t>(omp_get_thread_num()) * d;
#pragma omp for schedule(static)
    for (int64_t u = 0; u < U; ++u) {
      std::fill(sdp.begin(), sdp.end(), 0.0f);
      for (int32_t i = rb.offsets[u]; i < rb.offsets[u + 1]; ++i) {
        const int64_t n = rb.order[i];
        const float* g = dh + n * d;
        const float* mo = a.mlp_out.data() + n * d;
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) sdp[j] += g[j] * mo[j];
      }
      const float* ne = a.nrows.data() + u * d;
      const float* e = a.rows.data() + u * d;
      const float inv = a.inv_norm[u];
      float dot = 0.0f, ss = 0.0f;
#pragma omp simd reduction(+ : dot, ss)
      for (int64_t j = 0; j < d; ++j) {
        dsp[j] += sdp[j] * ne[j];
        sdp[j] *= s[j];  // now dL/dNorm(E)
        dot += e[j] * sdp[j];
        ss += e[j] * e[j];
      }
      float* out = grow[u];
      if (norm) {
        const float r = std::sqrt(ss);
        const float c = r > 0.0f ? dot * inv * inv / r : 0.0f;
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) out[j] += sdp[j] * inv - e[j] * c;
      } else {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) out[j] += sdp[j];
      }
    }
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* ne = a.nrows.data() + static_cast<int64_t>(rb.inverse[n]) * d;
      const float* g = dh + n * d;
      float* o = dmlp + n * d;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) o[j] = g[j] * (1.0f + s[j] * ne[j]);
    }
  }
  for (int t = 0; t < nt; ++t)
    for (int64_t j = 0; j < d; ++j) ds[j] += ds_part[static_cast<size_t>(t * d + j)];
}

void jtok_forward_ref(float* h_next, const float* h_mid, const float* mlp_out, const float* s, const TokenTable& E,
                      const int32_t* ids, int64_t N, int64_t d, float eps, bool norm) {
  for (int64_t n = 0; n < N; ++n) {
    const float* e = E.row(ids[n]);
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(e[j]) * e[j];
    const double inv = norm ? 1.0 / (std::sqrt(ss) + eps) : 1.0;
    for (int64_t j = 0; j < d; ++j)
      h_next[n * d + j] = static_cast<float>(h_mid[n * d + j] + mlp_out[n * d + j] * (1.0 + s[j] * e[j] * inv));
  }
}

void jtok_backward_ref(float* dmlp, float* ds, float* dE, const float* dh, const float* mlp_out, const float* s,
                       const TokenTable& E, const int32_t* ids, int64_t N, int64_t d, float eps, bool norm) {
  for (int64_t n = 0; n < N; ++n) {
    const float* e = E.row(ids[n]);
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(e[j]) * e[j];
    const double r = std::sqrt(ss), inv = norm ? 1.0 / (r + eps) : 1.0;
    // dL/dNorm_j = dh_j * m_j * s_j ; Jacobian of Norm: (I/(r+eps) - e e^T / (r (r+eps)^2))
    double dot = 0;
    std::vector<double> g(static_cast<size_t>(d));
    for (int64_t j = 0; j < d; ++j) {
      double dp = static_cast<double>(dh[n * d + j]) * mlp_out[n * d + j];
      ds[j] += static_cast<float>(dp * e[j] * inv);
      g[j] = dp * s[j];
      dot += g[j] * e[j];
      dmlp[n * d + j] = static_cast<float>(dh[n * d + j] * (1.0 + s[j] * e[j] * inv));
    }
    float* out = dE + static_cast<int64_t>(ids[n]) * d;
    for (int64_t j = 0; j < d; ++j)
      out[j] += static_cast<float>(norm ? g[j] * inv - (r > 0 ? e[j] * dot * inv * inv / r : 0.0) : g[j]);
  }
}

}  // namespace jtok
