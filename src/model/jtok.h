// JTok (paper section 3.2, eqs. 2-4): a token-indexed gate on a layer's MLP update,
//   p = 1 + s * Norm_eps(E[x]),  Norm_eps(u) = u / (||u||_2 + eps)   (or u itself: the no-norm ablation)
//   h_next = h_mid + Delta_m * p
// E is a TokenTable (V x d), s a per-dimension scaler (d). Rows are gathered once per unique id of
// the micro-batch (RowBatch) and the table gradient is row-sparse.
#pragma once
#include <cstdint>
#include <vector>

#include "model/token_table.h"

namespace jtok {

// What the backward needs for one layer and micro-batch.
struct JTokActs {
  std::vector<float> rows;      // (U,d) gathered E rows
  std::vector<float> inv_norm;  // (U) 1 / (||E[x]|| + eps), or 1 without norm
  std::vector<float> nrows;     // (U,d) Norm_eps(E[x])
  std::vector<float> mlp_out;   // (N,d) Delta_m, the ungated MLP update
};

// Gathers and normalises the unique rows of rb into a.
// sync, table: passed to gather_unique_rows (rows brought current before they are read).
// provider (optional): the rows come from it instead of E (embedding parallelism).
void jtok_prepare(JTokActs& a, const TokenTable& E, const RowBatch& rb, float eps, bool norm, const RowSync& sync = {},
                  int64_t table = 0, TableProvider* provider = nullptr);
// Whether every s[j] (d) is 0: then p = 1 exactly and the gate can be skipped (forward_hidden).
bool jtok_gate_is_one(const float* s, int64_t d);
// h_next (N,d) = h_mid + mlp_out * (1 + s * nrows[inverse[n]]).
void jtok_forward(float* h_next, const float* h_mid, const JTokActs& a, const float* s, const RowBatch& rb, int64_t N,
                  int64_t d);
// From dh = dL/dh_next (N,d): dmlp (N,d) = dh * p (overwritten), ds (d) += dL/ds, and the table rows'
// gradients are accumulated into gE.
void jtok_backward(float* dmlp, float* ds, SparseRowGrad& gE, const float* dh, const JTokActs& a, const float* s,
                   const RowBatch& rb, int64_t N, int64_t d, bool norm);

// References: per position, no deduplication, double accumulation. dE is a dense (V,d) gradient.
void jtok_forward_ref(float* h_next, const float* h_mid, const float* mlp_out, const float* s, const TokenTable& E,
                      const int32_t* ids, int64_t N, int64_t d, float eps, bool norm);
void jtok_backward_ref(float* dmlp, float* ds, float* dE, const float* dh, const float* mlp_out, const float* s,
                       const TokenTable& E, const int32_t* ids, int64_t N, int64_t d, float eps, bool norm);

}  // namespace jtok
