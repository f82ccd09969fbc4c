// JTok on the GPU (paper section 3.2, eqs. 2-4), src/model/jtok.h's arithmetic:
//   p = 1 + s * Norm_eps(E[x]),  Norm_eps(u) = u / (||u||_2 + eps)  (or u: the no-norm ablation)
//   h_next = h_mid + Delta_m * p
// over the micro-batch's deduplicated ids (dedup.h): a row is gathered and normalised once per
// unique id, and its gradient summed over the id's positions in position order (as the CPU's
// jtok_backward; an id with more than kHotChunk positions in pieces first, cuda/hot_ids.cuh) into a
// table-shaped fp32 gradient, with a flag per touched row for the table
// AdamW (table_adamw.h). No atomics: ds is summed per unique id, then over ids in order.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/dedup.h"

namespace jtok::cuda {

// E (V,d) of T, rb -> nrows (N bound, d) = Norm_eps(E[unique[u]]) for u < U, inv_norm (N bound) fp32 =
// 1 / (||E[unique[u]]|| + eps) (1 without norm). N: the micro-batch's positions (rb's bound).
template <typename T>
void jtok_prepare(T* nrows, float* inv_norm, const T* E, const DeviceRowBatch& rb, int64_t N, int64_t d, float eps,
                  bool norm, cudaStream_t stream);

// h_mid, mlp_out (N,d), s (d), nrows (jtok_prepare) -> h_next (N,d) = h_mid + mlp_out * (1 + s * nrows[inverse[n]]).
// h_next may alias h_mid.
template <typename T>
void jtok_forward(T* h_next, const T* h_mid, const T* mlp_out, const T* s, const T* nrows, const DeviceRowBatch& rb,
                  int64_t N, int64_t d, cudaStream_t stream);

// Floats of scratch jtok_backward needs: ds's per-id partials (N bound, d), then its hot ids' pieces.
inline int64_t jtok_backward_scratch(int64_t N, int64_t d) { return N * d + hot_scratch_floats(N, d); }

// dh = dL/dh_next (N,d) -> dmlp (N,d) = dh * p (overwritten); ds (d) fp32 += dL/ds; gE (V,d) fp32:
// row unique[u] = its gradient (the CPU's SparseRowGrad row), added to the row where touched[unique[u]]
// is already 1 (an earlier micro-batch's), written over it where 0 (so the optimizer need not zero
// the rows it used: table_adamw.h); touched (V): 1 at every unique[u] (left as is elsewhere). E,
// nrows, inv_norm: the forward's. rb an identity batch (rb.distinct false, a row a position): the
// rows' gradients added by fp32 atomics, in no fixed order, into rows that must be zero where not
// flagged (table_adamw_step's zero_grad_rows).
template <typename T>
void jtok_backward(T* dmlp, float* ds, float* gE, uint8_t* touched, float* scratch, const T* dh, const T* mlp_out,
                   const T* s, const T* E, const T* nrows, const float* inv_norm, const DeviceRowBatch& rb, int64_t N,
                   int64_t d, bool norm, cudaStream_t stream);

}  // namespace jtok::cuda
