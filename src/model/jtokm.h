// JTok-M (paper section 3.3, Appendix D): per layer n_e token-indexed tables E_i (V x d), a router
// R (n_e x d) on the attention input a = RMSNorm(h_in), and a residual injection beside the MLP:
//   g = R a,  G = TopK(g, K) (ties to the lower index),  w_i = sigmoid(g_i) / sum_{j in G} sigmoid(g_j)
//   e = sum_{i in G} w_i E_i[x],  Delta_r = c * s * e / (||e||_2 + eps),  c = 1/sqrt(2 N_layers) (or 1)
//   h_next += Delta_r
// Load balancing (App. D), per layer over the T tokens of the micro-batch:
//   p_t^(i) = sigmoid(g_ti) / sum_j sigmoid(g_tj),  P_i = sum_t p_t^(i),  n_i = #{t: i in G_t}
//   aux = lambda * n_e / (T^2 K) * sum_i P_i n_i      (n_i is a count: no gradient flows through it)
// Only the (unique id, table) pairs some position selected are gathered, each once; the tables'
// gradients are row-sparse.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/token_table.h"
#include "ops/lowp_linear.h"

namespace jtok {

struct JTokMHyper {
  int64_t n_e = 5, K = 2;
  float c = 1.0f;        // depth scaling 1/sqrt(2 N_layers), or 1 (ablation)
  float eps = 1e-6f;
  bool norm = true;      // false: e is injected without the L2 norm (ablation)
  double lambda = 1e-4;  // aux loss coefficient
};
JTokMHyper jtokm_hyper(const ModelConfig& c);

// A layer's aux loss from its statistics, tables in order: lambda * n_e / (N^2 K) * sum_i P_i n_i.
// The CPU's routing and the GPU trainer (which reads P and n back) both take it from here.
double jtokm_aux_loss(const double* prob_sum, const double* load, int64_t N, const JTokMHyper& hp);

// What the backward (and the telemetry) needs for one layer and micro-batch.
struct JTokMActs {
  // Set by the caller: per_row when decoding (the router's product by the per-row kernel, so a row's
  // routing does not depend on the other rows); fastest (sgemm) otherwise.
  RowKernel router_rows = RowKernel::fastest;
  std::vector<float> logits;     // (N, n_e) router logits g
  std::vector<float> sig;        // (N, n_e) sigmoid(g)
  std::vector<int32_t> sel;      // (N, K) selected tables, by descending logit
  std::vector<float> w;          // (N, K) mixing weights of sel
  std::vector<int32_t> slot;     // (U, n_e) index of the gathered row of (unique id u, table i), or -1
  std::vector<int32_t> slot_u, slot_table;  // (S) the (u, i) pair of each gathered row
  std::vector<float> rows;       // (S, d) gathered rows E_i[unique[u]]
  std::vector<float> e;          // (N, d) mixed vectors
  std::vector<float> inv_norm;   // (N) 1 / (||e|| + eps), or 1 without the norm
  std::vector<double> load;      // (n_e) n_i, tokens that selected table i
  std::vector<double> prob_sum;  // (n_e) P_i
  std::vector<double> weight_sum;  // (n_e) sum of w over the tokens that selected table i (telemetry)
  double aux = 0;                // this layer's aux loss, lambda included
  std::vector<float> de;         // (N, d) backward scratch: dL/de
  std::vector<int32_t> pos_ids;  // (N) each position's id (with a provider)
};

// Routing, gather, mixing and injection: h_next (N,d) += Delta_r. a (N,d) is the attention input,
// R (n_e,d) the router, s (d) the scaler, E the layer's n_e tables (consecutive), rb the batch's ids.
// sync (optional): called for each gathered (table_base + i, id) before its row is read.
void jtokm_forward(float* h_next, JTokMActs& acts, const float* a, const float* R, const float* s, const TokenTable* E,
                   const RowBatch& rb, int64_t N, int64_t d, const JTokMHyper& hp, const RowSync& sync = {},
                   int64_t table_base = 0, TableProvider* provider = nullptr);
// From dh = dL/dh_next (N,d): da (N,d) += through the router, dR (n_e,d) +=, ds (d) +=, the tables'
// row gradients gE[i] +=. aux_grad is dL/d(this layer's aux) (e.g. grad_scale / #JTok-M layers).
// provider (optional, as in the forward): e was mixed by it, dL/dw comes from it, and it keeps the
// tables' gradients (gE unused).
void jtokm_backward(float* da, float* dR, float* ds, SparseRowGrad* gE, JTokMActs& acts, const float* dh, const float* a,
                    const float* R, const float* s, const RowBatch& rb, int64_t N, int64_t d, const JTokMHyper& hp,
                    float aux_grad, TableProvider* provider = nullptr, int64_t table_base = 0);

// The same in two parts (jtokm_forward is route + mix_inject). Routing (logits, top-K, weights,
// load statistics, aux loss) reads only the attention input a, so the forward runs it right after
// the layer's input norm, before attention; with a provider it then announces the routing
// (TableProvider::mix_post), so the rows' owners can mix while attention and the MLP run.
// jtokm_mix_inject, at the layer's write-back (eq. 10), gathers and mixes (or takes the owners'
// mixed vectors), normalises and injects. The same float operations in the same order as
// jtokm_forward: the split changes no bit.
void jtokm_route(JTokMActs& acts, const float* a, const float* R, const RowBatch& rb, int64_t N, int64_t d,
                 const JTokMHyper& hp, int64_t table_base = 0, TableProvider* provider = nullptr);
void jtokm_mix_inject(float* h_next, JTokMActs& acts, const float* s, const TokenTable* E, const RowBatch& rb, int64_t N,
                      int64_t d, const JTokMHyper& hp, const RowSync& sync = {}, int64_t table_base = 0,
                      TableProvider* provider = nullptr);
// The backward in two parts (jtokm_backward is both). jtokm_backward_de: dL/de (acts.de) from
// dh = dL/dh_next, ds +=; with a provider, dL/de is posted to it (mix_backward_post).
// jtokm_backward_router: dL/dw (from the gathered rows, or the provider), then dR +=, da +=
// through the router, and (local path) the tables' row gradients gE +=. Between the two the caller
// may run anything that leaves acts, a, R and s alone (the layer's MLP and attention backward).
void jtokm_backward_de(float* ds, JTokMActs& acts, const float* dh, const float* s, int64_t N, int64_t d,
                       const JTokMHyper& hp, TableProvider* provider = nullptr, int64_t table_base = 0);
void jtokm_backward_router(float* da, float* dR, SparseRowGrad* gE, JTokMActs& acts, const float* a, const float* R,
                           const RowBatch& rb, int64_t N, int64_t d, const JTokMHyper& hp, float aux_grad,
                           TableProvider* provider = nullptr, int64_t table_base = 0);

// References: per position, no deduplication, double accumulation. out (N,d) += Delta_r; returns aux.
// dE: n_e dense (V,d) gradients, each its own vector.
double jtokm_forward_ref(float* out, const float* a, const float* R, const float* s, const TokenTable* E,
                         const int32_t* ids, int64_t N, int64_t d, const JTokMHyper& hp);
void jtokm_backward_ref(float* da, float* dR, float* ds, std::vector<std::vector<float>>& dE, const float* dh,
                        const float* a, const float* R, const float* s, const TokenTable* E, const int32_t* ids,
                        int64_t N, int64_t d, const JTokMHyper& hp, float aux_grad);

}  // namespace jtok
