// JTok-M on the GPU (paper section 3.3, App. D), src/model/jtokm.cpp's arithmetic: per layer n_e
// tables E_i (V x d, stored consecutively: E (n_e, V, d)), a router on the attention input a:
//   g = R a (the caller's product: gemm_ref or cuBLASLt),  G = TopK(g, K) (ties to the lower index)
//   w_i = sigmoid(g_i) / sum_{j in G} sigmoid(g_j),  e = sum_{k} w_k E_{sel_k}[x]  (k in order from 0)
//   h_next += c * s * e / (||e|| + eps)
// and the load-balancing aux loss lambda * n_e / (N^2 K) * sum_i P_i n_i (the host's, from P and n read
// back: model/jtokm.h's jtokm_aux_loss). Table gradients go into
// table-shaped fp32 gradients gE (n_e, V, d) with touched flags (n_e, V) for table_adamw.h, each
// (id, table) row summed over the id's positions in position order (dedup.h): no atomics.
// T, the activations' type: float (the checking instantiation) or __nv_bfloat16 (the fast path). T is
// what the kernels read of the model (h_next, dh, the scaler s, the tables' forward copy E) and what
// they write into it (h_next, dg for the router's two products); the router logits, sigmoids, weights,
// e, its norm, dL/de and every sum are fp32, and the tables' gradients go to fp32 gE. e is never
// stored: each kernel that needs it mixes it again from the K rows (mix_element: the same fp32 ops in
// the same order, so the backward's e has the forward's bits), which it reads anyway for dL/dg; (N, d)
// fp32 written and read back a layer cost more than the rows, most of which L2 holds. Tables are
// indexed (table * V + id) * d.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/dedup.h"

namespace jtok::cuda {

constexpr int kJTokMMaxTables = 32;  // n_e bound of the per-position kernels

struct JTokMDims {
  int64_t N = 0, d = 0, V = 0, n_e = 5, K = 2;
  float c = 1.0f, eps = 1e-6f;
  bool norm = true;
  double lambda = 1e-4;
};

// What the forward keeps for the backward (device arrays, sized by the caller).
struct JTokMDeviceActs {
  float* sig = nullptr;       // (N, n_e) sigmoid(g)
  int32_t* sel = nullptr;     // (N, K) selected tables, by descending logit
  float* w = nullptr;         // (N, K) mixing weights
  float* inv_norm = nullptr;  // (N) 1 / (||e|| + eps), or 1 without the norm
  int32_t* load = nullptr;    // (n_e) n_i, positions that selected table i
  double* prob_sum = nullptr;    // (n_e) P_i
  double* weight_sum = nullptr;  // (n_e) sum of w over the positions that selected table i (telemetry; may be null)
};

// The (id, table) rows a layer's routing chose, for the table optimizer to bring current (dedup.h's
// RowSubset), as the CPU's gather syncs them: bits (rb's entries bound; U used, zeroed first) bit i
// set where some position of unique[u] selected table i. Each listed once; a position ORs its tables
// into its entry (atomicOr: the same bits in any order, and no thread walks a frequent id's
// thousands of positions).
struct ChosenTables {
  uint32_t* bits = nullptr;
  DeviceRowBatch rb;
};

// logits (N, n_e) -> acts.sig, sel, w: what the mix reads (a decoder needs no more); with
// chosen.bits, training's chosen tables too, in the same launch.
void jtokm_route(const JTokMDeviceActs& acts, const float* logits, const JTokMDims& dm, cudaStream_t stream,
                 const ChosenTables& chosen = {});
// After jtokm_route, training's: acts.sig, sel, w -> load, prob_sum (and weight_sum where set): one
// launch, a block a table. The aux loss is the host's, from load and prob_sum (model/jtokm.h).
void jtokm_route_stats(const JTokMDeviceActs& acts, const JTokMDims& dm, cudaStream_t stream);

// ids (N), E (n_e, V, d) of T, s (d) of T -> acts.inv_norm; h_next (N, d) of T += c * inv * s * e.
// One block a position: gather, mix, norm, then mix again (the rows from L1) and inject. With
// route_logits (N, n_e), each block routes its position first, as jtokm_route does (acts.sig, sel, w:
// the same bits), so a decoder, which needs no statistics, launches no route kernel.
template <typename T>
void jtokm_mix_inject(T* h_next, const JTokMDeviceActs& acts, const int32_t* ids, const T* E, const T* s,
                      const JTokMDims& dm, cudaStream_t stream, const float* route_logits = nullptr);

// Floats of scratch jtokm_backward_de needs: ds's per-block partials.
int64_t jtokm_backward_de_scratch(const JTokMDims& dm);

// dh = dL/dh_next (N, d) of T, s (d) of T, ids (N), E (n_e, V, d) of T (the forward's copy: e mixed
// again from its rows) -> de (N, d) fp32 = dL/de; ds (d) fp32 += (per-block partials summed in block
// order); dg (N, n_e) of T = dL/dg (dw_k = de . E_{sel_k}[x], then the mixing weights' and the aux
// loss's gradients through the sigmoids, in fp32, rounded once on the store). The caller then adds
// dR (n_e, d) += dg^T a and da (N, d) += dg R (two products). aux_grad: dL/d(this layer's aux). One
// kernel: a block a range of positions, kDeRows at a time (jtokm.cu).
template <typename T>
void jtokm_backward_de(float* de, float* ds, T* dg, float* scratch, const JTokMDeviceActs& acts, const T* dh,
                       const T* s, const int32_t* ids, const T* E, float aux_grad, const JTokMDims& dm,
                       cudaStream_t stream);

// Floats of scratch jtokm_backward_tables needs (its hot ids' pieces: cuda/hot_ids.cuh).
int64_t jtokm_backward_tables_scratch(const JTokMDims& dm);

// de (N, d) fp32, rb = dedup_ids(ids) -> gE (n_e, V, d) fp32: row (i, unique[u]) += sum over u's positions that
// selected i, in position order (an id with more than kHotChunk positions in pieces first, summed in
// order), of w * de, from zero where touched (n_e, V) is 0 there (the row's
// values are stale: jtok.h's jtok_backward); touched = 1 there. rb an identity batch (distinct false,
// a position each): each position's w * de added by fp32 atomics, in no fixed order, into rows that
// must be zero where not flagged. hot: jtokm_backward_tables_scratch(dm) floats.
void jtokm_backward_tables(float* gE, uint8_t* touched, const JTokMDeviceActs& acts, const float* de,
                           const DeviceRowBatch& rb, const JTokMDims& dm, float* hot, cudaStream_t stream);

}  // namespace jtok::cuda
