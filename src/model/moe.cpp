#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/top_k.h"
#include "ops/linear.h"
#include "ops/swiglu.h"

namespace jtok {

MoeDims moe_dims(const ModelConfig& c) {
  MoeDims m;
  m.d = c.hidden_size;
  m.E = c.n_routed_experts;
  m.K = c.num_experts_per_tok;
  m.F = c.moe_intermediate_size;
  m.S = c.shared_intermediate();
  m.norm_topk = c.norm_topk_prob;
  m.aux_coef = c.router_aux_loss_coef;
  return m;
}

namespace {

template <typename T>
void softmax_row(T* p, int64_t E) {
  T mx = p[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, p[e]);
  T sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(p[e] - mx));
  for (int64_t e = 0; e < E; ++e) p[e] /= sum;
}

void resize(std::vector<float>& v, int64_t n) { v.resize(static_cast<size_t>(n)); }

}  // namespace

WeightMatrix moe_matrix(const MoeWeights& w, const MoeDims& m, const MoeLowp* lp, int64_t e, ExpertProj p) {
  const int i = static_cast<int>(p);
  if (lp) {
    const WeightMatrix* q = e < 0 ? &lp->shared[i] : e < static_cast<int64_t>(lp->routed.size()) ? &lp->routed[e][i] : nullptr;
    if (q && q->data) return *q;
  }
  const int64_t d = m.d, F = e < 0 ? m.S : m.F;
  const float* W = e < 0 ? (p == ExpertProj::gate ? w.sg : p == ExpertProj::up ? w.su : w.sd)
                         : (p == ExpertProj::gate ? expert_gate(w, m, e) : p == ExpertProj::up ? expert_up(w, m, e) : expert_down(w, m, e));
  return p == ExpertProj::down ? WeightMatrix{Dtype::f32, W, nullptr, d, F} : WeightMatrix{Dtype::f32, W, nullptr, F, d};
}

namespace {

// out (N, w.rows) (+)= inp @ w^T. fp32: the training path's own calls (linear_forward_many), so its
// numerics do not depend on the low-precision kernels; per_row (decoding): the per-row kernels,
// whatever the dtype.
void expert_linear(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate, RowKernel rk) {
  if (w.dtype != Dtype::f32 || rk == RowKernel::per_row) return linear_forward_lowp(out, inp, w, N, accumulate, rk);
  const LinearProduct p{out, static_cast<const float*>(w.data), w.rows, accumulate};
  linear_forward_many(&p, 1, inp, N, w.cols);
}

// Gate and up of one input block: one pass of the low-precision kernels when both are (the input
// quantised once), else one call each.
void expert_gate_up(float* g, float* u, const float* inp, const WeightMatrix& wg, const WeightMatrix& wu, int64_t N,
                    RowKernel rk) {
  if ((wg.dtype != Dtype::f32 && wu.dtype != Dtype::f32) || rk == RowKernel::per_row) {
    const LinearOut gu[2] = {{g, wg}, {u, wu}};
    return linear_forward_lowp_multi(gu, 2, inp, N, rk);
  }
  if (wg.dtype != Dtype::f32 || wu.dtype != Dtype::f32) {
    expert_linear(g, inp, wg, N, false, rk);
    expert_linear(u, inp, wu, N, false, rk);
    return;
  }
  const LinearProduct gu[2] = {{g, static_cast<const float*>(wg.data), wg.rows, false},
                               {u, static_cast<const float*>(wu.data), wu.rows, false}};
  linear_forward_many(gu, 2, inp, N, wg.cols);  // at bf16 precision the input rounded once
}

}  // namespace

namespace {

// Router: softmax over all routed experts, then top-k and the weights. a.probs (N, E), a.topi and
// a.topw (N, K).
void route_tokens(MoeActs& a, const float* x, const MoeWeights& w, const MoeDims& m, int64_t N, RowKernel rk) {
  const int64_t d = m.d, E = m.E, K = m.K, NK = N * K;
  resize(a.probs, N * E);
  a.topi.resize(static_cast<size_t>(NK));
  resize(a.topw, NK);
  if (rk == RowKernel::per_row) linear_forward_lowp(a.probs.data(), x, {Dtype::f32, w.router, nullptr, E, d}, N, false, rk);
  else linear_forward(a.probs.data(), x, w.router, N, d, E);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* p = a.probs.data() + n * E;
    softmax_row(p, E);
    int32_t* ti = a.topi.data() + n * K;
    float* tw = a.topw.data() + n * K;
    top_k_lower_index(ti, p, E, K);
    float sum = 0;
    for (int64_t j = 0; j < K; ++j) sum += (tw[j] = p[ti[j]]);
    if (m.norm_topk)
      for (int64_t j = 0; j < K; ++j) tw[j] /= sum;
  }
}

// Counting sort of the N K slots by expert (stable: rows of an expert in position order):
// a.offsets (E + 1), a.slot_of (row -> slot), a.row_of (slot -> row).
void sort_slots_by_expert(MoeActs& a, int64_t E, int64_t NK) {
  a.offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t s = 0; s < NK; ++s) a.offsets[a.topi[s] + 1]++;
  for (int64_t e = 0; e < E; ++e) a.offsets[e + 1] += a.offsets[e];
  a.slot_of.resize(static_cast<size_t>(NK));
  a.row_of.resize(static_cast<size_t>(NK));
  std::vector<int32_t> next(a.offsets.begin(), a.offsets.end() - 1);
  for (int64_t s = 0; s < NK; ++s) {
    const int32_t r = next[a.topi[s]]++;
    a.slot_of[r] = static_cast<int32_t>(s);
    a.row_of[s] = r;
  }
}

// Gathers each expert's tokens into one block (a.xg), then one GEMM per expert and projection:
// a.g, a.u, a.act (N K, F), a.eo (N K, d).
void routed_experts_forward(MoeActs& a, const float* x, const MoeWeights& w, const MoeDims& m, int64_t N,
                            const MoeLowp* lp, RowKernel rk) {
  const int64_t d = m.d, E = m.E, K = m.K, F = m.F, NK = N * K;
  resize(a.xg, NK * d); resize(a.g, NK * F); resize(a.u, NK * F); resize(a.act, NK * F); resize(a.eo, NK * d);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < NK; ++r) std::memcpy(&a.xg[r * d], x + (a.slot_of[r] / K) * d, sizeof(float) * d);
  auto mat = [&](int64_t e, ExpertProj p) { return moe_matrix(w, m, lp, e, p); };
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], ne = a.offsets[e + 1] - r0;
    if (ne == 0) continue;
    expert_gate_up(&a.g[r0 * F], &a.u[r0 * F], &a.xg[r0 * d], mat(e, ExpertProj::gate), mat(e, ExpertProj::up), ne, rk);
  }
  swiglu_forward(a.act.data(), a.g.data(), a.u.data(), NK * F);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], ne = a.offsets[e + 1] - r0;
    if (ne == 0) continue;
    expert_linear(&a.eo[r0 * d], &a.act[r0 * F], mat(e, ExpertProj::down), ne, false, rk);
  }
}

// Shared experts: one SwiGLU of width S over every position, accumulated onto out (N, d).
void shared_experts_forward(float* out, MoeActs& a, const float* x, const MoeWeights& w, const MoeDims& m, int64_t N,
                            const MoeLowp* lp, RowKernel rk) {
  const int64_t S = m.S;
  auto mat = [&](ExpertProj p) { return moe_matrix(w, m, lp, -1, p); };
  resize(a.sg, N * S); resize(a.su, N * S); resize(a.sact, N * S);
  expert_gate_up(a.sg.data(), a.su.data(), x, mat(ExpertProj::gate), mat(ExpertProj::up), N, rk);
  swiglu_forward(a.sact.data(), a.sg.data(), a.su.data(), N * S);
  expert_linear(out, a.sact.data(), mat(ExpertProj::down), N, /*accumulate=*/true, rk);
}

// Scatter back onto out (N, d), each expert row weighted; per position, so no two threads write one row.
void combine_expert_outputs(float* out, const MoeActs& a, int64_t d, int64_t K, int64_t N) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* o = out + n * d;
    for (int64_t j = 0; j < K; ++j) {
      const float wj = a.topw[n * K + j];
      const float* eo = &a.eo[static_cast<int64_t>(a.row_of[n * K + j]) * d];
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) o[i] += wj * eo[i];
    }
  }
}

// Load balance: f_i = count_i / (N K), P_i = mean_n probs[n,i]; aux = coef E sum_i f_i P_i.
void load_balance_aux(MoeActs& a, const MoeDims& m, int64_t N) {
  const int64_t E = m.E, NK = N * m.K;
  resize(a.frac, E);
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) {
    a.frac[e] = static_cast<float>(a.offsets[e + 1] - a.offsets[e]) / static_cast<float>(NK);
    double P = 0;
    for (int64_t n = 0; n < N; ++n) P += a.probs[n * E + e];
    aux += a.frac[e] * (P / static_cast<double>(N));
  }
  a.aux = m.aux_coef * static_cast<double>(E) * aux;
}

}  // namespace

void moe_forward(float* out, MoeActs& a, const float* x, const MoeWeights& w, const MoeDims& m, int64_t N,
                 const MoeLowp* lp, RowKernel rk) {
  route_tokens(a, x, w, m, N, rk);
  sort_slots_by_expert(a, m.E, N * m.K);
  routed_experts_forward(a, x, w, m, N, lp, rk);
  if (m.S > 0) shared_experts_forward(out, a, x, w, m, N, lp, rk);
  combine_expert_outputs(out, a, m.d, m.K, N);
  load_balance_aux(a, m, N);
}

namespace {

// Combine step: d(expert output row) = w * dout (s.deo); dL/dw = dout . eo. Then through the
// weights (the top-k choice is fixed) and the aux loss to dL/dprobs, and through the softmax to
// the router logits' gradient (s.dprobs, in place).
void combine_backward(MoeScratch& s, const float* dout, const MoeActs& a, const MoeDims& m, int64_t N, float aux_grad) {
  const int64_t d = m.d, E = m.E, K = m.K;
  const float aux_scale = static_cast<float>(aux_grad * m.aux_coef * static_cast<double>(E) / static_cast<double>(N));
#pragma omp parallel
  {
  std::vector<float> dw(static_cast<size_t>(K));
#pragma omp for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* go = dout + n * d;
    float* dp = s.dprobs.data() + n * E;
    for (int64_t e = 0; e < E; ++e) dp[e] = aux_scale * a.frac[e];
    for (int64_t j = 0; j < K; ++j) {
      const int64_t r = a.row_of[n * K + j];
      const float wj = a.topw[n * K + j];
      const float* eo = &a.eo[r * d];
      float* de = &s.deo[r * d];
      float acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < d; ++i) {
        de[i] = wj * go[i];
        acc += go[i] * eo[i];
      }
      dw[j] = acc;
    }
    const int32_t* ti = a.topi.data() + n * K;
    if (m.norm_topk) {  // w_j = p_j / sum_l p_l: dp_l = (dw_l - sum_j dw_j w_j) / sum
      float sum = 0, dot = 0;
      for (int64_t j = 0; j < K; ++j) sum += a.probs[n * E + ti[j]], dot += dw[j] * a.topw[n * K + j];
      for (int64_t j = 0; j < K; ++j) dp[ti[j]] += (dw[j] - dot) / sum;
    } else {
      for (int64_t j = 0; j < K; ++j) dp[ti[j]] += dw[j];
    }
    // Softmax backward in place: dlogit_e = p_e (dp_e - sum_l p_l dp_l).
    const float* p = a.probs.data() + n * E;
    float pd = 0;
    for (int64_t e = 0; e < E; ++e) pd += p[e] * dp[e];
    for (int64_t e = 0; e < E; ++e) dp[e] = p[e] * (dp[e] - pd);
  }
  }
}

// Routed experts, grouped as in the forward: s.deo -> s.dact -> s.dg, s.du -> s.dxg (N K, d). A
// frozen block (g.experts null) gets no weight gradient.
void routed_experts_backward(const MoeWeights& g, MoeScratch& s, const MoeActs& a, const MoeWeights& w,
                             const MoeDims& m, int64_t N) {
  const int64_t d = m.d, E = m.E, F = m.F, NK = N * m.K;
  auto gw = [&](float* (*at)(const MoeWeights&, const MoeDims&, int64_t), int64_t e) { return g.experts ? at(g, m, e) : nullptr; };
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], ne = a.offsets[e + 1] - r0;
    if (ne == 0) continue;
    linear_backward(&s.dact[r0 * F], gw(expert_down, e), &s.deo[r0 * d], &a.act[r0 * F], expert_down(w, m, e), ne, F, d);
  }
  swiglu_backward(s.dg.data(), s.du.data(), s.dact.data(), a.g.data(), a.u.data(), NK * F);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], ne = a.offsets[e + 1] - r0;
    if (ne == 0) continue;
    const LinearGrad gu[2] = {{gw(expert_gate, e), &s.dg[r0 * F], expert_gate(w, m, e), F},
                              {gw(expert_up, e), &s.du[r0 * F], expert_up(w, m, e), F}};
    linear_backward_many(&s.dxg[r0 * d], gu, 2, &a.xg[r0 * d], ne, d);
  }
}

// dx (N, d) += the expert rows' input gradients (s.dxg), per position.
void gather_expert_dx(float* dx, const MoeScratch& s, const MoeActs& a, int64_t d, int64_t K, int64_t N) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* o = dx + n * d;
    for (int64_t j = 0; j < K; ++j) {
      const float* r = &s.dxg[static_cast<int64_t>(a.row_of[n * K + j]) * d];
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) o[i] += r[i];
    }
  }
}

// Shared experts: dout -> dx (+=) and their weights' gradients.
void shared_experts_backward(float* dx, const MoeWeights& g, MoeScratch& s, const float* dout, const float* x,
                             const MoeActs& a, const MoeWeights& w, const MoeDims& m, int64_t N) {
  const int64_t d = m.d, S = m.S;
  s.dsact.assign(static_cast<size_t>(N * S), 0.0f);
  resize(s.dsg, N * S); resize(s.dsu, N * S);
  linear_backward(s.dsact.data(), g.sd, dout, a.sact.data(), w.sd, N, S, d);
  swiglu_backward(s.dsg.data(), s.dsu.data(), s.dsact.data(), a.sg.data(), a.su.data(), N * S);
  const LinearGrad gu[2] = {{g.sg, s.dsg.data(), w.sg, S}, {g.su, s.dsu.data(), w.su, S}};
  linear_backward_many(dx, gu, 2, x, N, d);
}

}  // namespace

void moe_backward(float* dx, const MoeWeights& g, MoeScratch& s, const float* dout, const float* x, const MoeActs& a,
                  const MoeWeights& w, const MoeDims& m, int64_t N, float aux_grad) {
  const int64_t d = m.d, E = m.E, K = m.K, F = m.F, NK = N * K;
  resize(s.deo, NK * d); resize(s.dprobs, N * E);
  s.dact.assign(static_cast<size_t>(NK * F), 0.0f);
  resize(s.dg, NK * F); resize(s.du, NK * F);
  s.dxg.assign(static_cast<size_t>(NK * d), 0.0f);
  combine_backward(s, dout, a, m, N, aux_grad);
  linear_backward(dx, g.router, s.dprobs.data(), x, w.router, N, d, E);
  routed_experts_backward(g, s, a, w, m, N);
  gather_expert_dx(dx, s, a, d, K, N);
  if (m.S > 0) shared_experts_backward(dx, g, s, dout, x, a, w, m, N);
}

// ---- reference ---------------------------------------------------------------------------------

namespace {

// One token through a SwiGLU (inner size F) in double: y (d) += scale * down(silu(gate x) * up x).
void swiglu_ref(std::vector<double>& y, const float* x, const float* Wg, const float* Wu, const float* Wd, int64_t d,
                int64_t F, double scale, std::vector<double>* unscaled = nullptr) {
  std::vector<double> act(static_cast<size_t>(F));
  for (int64_t f = 0; f < F; ++f) {
    double gg = 0, uu = 0;
    for (int64_t i = 0; i < d; ++i) gg += static_cast<double>(Wg[f * d + i]) * x[i], uu += static_cast<double>(Wu[f * d + i]) * x[i];
    act[f] = gg / (1.0 + std::exp(-gg)) * uu;
  }
  if (unscaled) unscaled->assign(static_cast<size_t>(d), 0.0);
  for (int64_t i = 0; i < d; ++i) {
    double o = 0;
    for (int64_t f = 0; f < F; ++f) o += static_cast<double>(Wd[i * F + f]) * act[f];
    y[i] += scale * o;
    if (unscaled) (*unscaled)[i] = o;
  }
}

// Backward of one token through a SwiGLU given dy (d): dx (d) += ..., weight grads +=.
void swiglu_ref_backward(double* dx, float* gWg, float* gWu, float* gWd, const double* dy, const float* x,
                         const float* Wg, const float* Wu, const float* Wd, int64_t d, int64_t F) {
  for (int64_t f = 0; f < F; ++f) {
    double gg = 0, uu = 0;
    for (int64_t i = 0; i < d; ++i) gg += static_cast<double>(Wg[f * d + i]) * x[i], uu += static_cast<double>(Wu[f * d + i]) * x[i];
    const double sg = 1.0 / (1.0 + std::exp(-gg)), act = gg * sg * uu;
    double dact = 0;
    for (int64_t i = 0; i < d; ++i) {
      dact += dy[i] * Wd[i * F + f];
      gWd[i * F + f] += static_cast<float>(dy[i] * act);
    }
    const double dgg = dact * uu * sg * (1.0 + gg * (1.0 - sg)), duu = dact * gg * sg;
    for (int64_t i = 0; i < d; ++i) {
      dx[i] += dgg * Wg[f * d + i] + duu * Wu[f * d + i];
      gWg[f * d + i] += static_cast<float>(dgg * x[i]);
      gWu[f * d + i] += static_cast<float>(duu * x[i]);
    }
  }
}

// Router of one token in double: probs (E), chosen experts (K), weights (K).
void route_ref(std::vector<double>& p, std::vector<int32_t>& ti, std::vector<double>& tw, const float* x,
               const MoeWeights& w, const MoeDims& m) {
  p.assign(static_cast<size_t>(m.E), 0.0);
  for (int64_t e = 0; e < m.E; ++e)
    for (int64_t i = 0; i < m.d; ++i) p[e] += static_cast<double>(w.router[e * m.d + i]) * x[i];
  softmax_row(p.data(), m.E);
  ti.assign(static_cast<size_t>(m.K), -1);
  top_k_lower_index(ti.data(), p.data(), m.E, m.K);
  tw.assign(static_cast<size_t>(m.K), 0.0);
  double sum = 0;
  for (int64_t j = 0; j < m.K; ++j) sum += (tw[j] = p[ti[j]]);
  if (m.norm_topk)
    for (auto& v : tw) v /= sum;
}

}  // namespace

double moe_forward_ref(float* out, const float* x, const MoeWeights& w, const MoeDims& m, int64_t N) {
  const int64_t d = m.d, E = m.E, K = m.K;
  std::vector<double> p, tw, y, cnt(static_cast<size_t>(E), 0.0), P(static_cast<size_t>(E), 0.0);
  std::vector<int32_t> ti;
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = x + n * d;
    route_ref(p, ti, tw, xn, w, m);
    y.assign(static_cast<size_t>(d), 0.0);
    if (m.S > 0) swiglu_ref(y, xn, w.sg, w.su, w.sd, d, m.S, 1.0);
    for (int64_t j = 0; j < K; ++j)
      swiglu_ref(y, xn, expert_gate(w, m, ti[j]), expert_up(w, m, ti[j]), expert_down(w, m, ti[j]), d, m.F, tw[j]);
    for (int64_t i = 0; i < d; ++i) out[n * d + i] += static_cast<float>(y[i]);
    for (int64_t e = 0; e < E; ++e) P[e] += p[e] / static_cast<double>(N);
    for (int64_t j = 0; j < K; ++j) cnt[ti[j]] += 1.0 / static_cast<double>(N * K);
  }
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) aux += cnt[e] * P[e];
  return m.aux_coef * static_cast<double>(E) * aux;
}

void moe_backward_ref(float* dx, const MoeWeights& g, const float* dout, const float* x, const MoeWeights& w,
                      const MoeDims& m, int64_t N, float aux_grad) {
  const int64_t d = m.d, E = m.E, K = m.K;
  // First pass: the load fractions f (need every token's routing).
  std::vector<double> p, tw, eo, f(static_cast<size_t>(E), 0.0);
  std::vector<int32_t> ti;
  for (int64_t n = 0; n < N; ++n) {
    route_ref(p, ti, tw, x + n * d, w, m);
    for (int64_t j = 0; j < K; ++j) f[ti[j]] += 1.0 / static_cast<double>(N * K);
  }
  std::vector<double> dy(static_cast<size_t>(d)), dxn(static_cast<size_t>(d)), dp(static_cast<size_t>(E)),
      dw(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = x + n * d;
    route_ref(p, ti, tw, xn, w, m);
    std::fill(dxn.begin(), dxn.end(), 0.0);
    for (int64_t i = 0; i < d; ++i) dy[i] = dout[n * d + i];
    if (m.S > 0) swiglu_ref_backward(dxn.data(), g.sg, g.su, g.sd, dy.data(), xn, w.sg, w.su, w.sd, d, m.S);
    std::vector<double> dye(static_cast<size_t>(d));
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = ti[j];
      std::vector<double> zero(static_cast<size_t>(d), 0.0);
      swiglu_ref(zero, xn, expert_gate(w, m, e), expert_up(w, m, e), expert_down(w, m, e), d, m.F, 1.0, &eo);
      dw[j] = 0;
      for (int64_t i = 0; i < d; ++i) dw[j] += dy[i] * eo[i], dye[i] = tw[j] * dy[i];
      swiglu_ref_backward(dxn.data(), expert_gate(g, m, e), expert_up(g, m, e), expert_down(g, m, e), dye.data(), xn,
                          expert_gate(w, m, e), expert_up(w, m, e), expert_down(w, m, e), d, m.F);
    }
    // dL/dp: aux term on every expert, the weights' term on the chosen ones.
    for (int64_t e = 0; e < E; ++e) dp[e] = aux_grad * m.aux_coef * static_cast<double>(E) * f[e] / static_cast<double>(N);
    double sum = 0, dot = 0;
    for (int64_t j = 0; j < K; ++j) sum += p[ti[j]], dot += dw[j] * tw[j];
    for (int64_t j = 0; j < K; ++j) dp[ti[j]] += m.norm_topk ? (dw[j] - dot) / sum : dw[j];
    double pd = 0;
    for (int64_t e = 0; e < E; ++e) pd += p[e] * dp[e];
    for (int64_t e = 0; e < E; ++e) {
      const double dl = p[e] * (dp[e] - pd);
      for (int64_t i = 0; i < d; ++i) {
        dxn[i] += dl * w.router[e * d + i];
        g.router[e * d + i] += static_cast<float>(dl * xn[i]);
      }
    }
    for (int64_t i = 0; i < d; ++i) dx[n * d + i] += static_cast<float>(dxn[i]);
  }
}

}  // namespace jtok
