// One Transformer layer's forward, every step in one place, for both of its callers: the training
// (and prefill) forward, forward_hidden (B sequences of T positions, keys and values kept per layer),
// and the KV-cache decode (infer/generate.cpp: M rows, each at its own position of its own cache).
//   a = RMSNorm(h_in); JTok-M routes on a; q, k, v = a W^T (+ variants); RoPE; att = Attention(q, k, v)
//   h_mid = h_in + att Wo^T; m = RMSNorm(h_mid); Delta_m = MLP or MoE of m
//   h_out = h_mid + Delta_m (JTok: * (1 + s Norm(E[x]))) (JTok-M: + Delta_r)
// What differs between the callers is chosen by them: the row kernels of the products (per_row when
// decoding, so a row's bits do not depend on the batch), the rows' positions, and the attention step
// (where keys and values live), a callback.
#pragma once
#include <cstdint>
#include <functional>

#include "model/transformer.h"

namespace jtok {

// The attention step: q (N, H*hd), k, v (N, KV*hd) after RoPE -> att (N, H*hd).
using AttendFn = std::function<void(float* att, const float* q, const float* k, const float* v)>;

// The buffers of one layer's forward (the caller's; N rows each).
struct LayerBuffers {
  const float* h_in;  // (N,d) the layer's input
  float* h_mid;       // (N,d) after attention; may be h_in (updated in place)
  float* h_out;       // (N,d) the layer's output; may be h_mid, or h_in when h_mid is not
  float *a, *rstd1;   // (N,d), (N) the attention input and its norm
  float *q, *k, *v;   // (N,qd), (N,kvd), (N,kvd)
  float* att;         // (N,qd)
  float *m, *rstd2;   // (N,d), (N) the MLP input; may be a, rstd1
  float *gate, *up, *act;  // (N,F) dense MLP layers
  QkNormActs* qk;
  JTokActs* jtok;     // JTok layers: gathered rows, mlp_out (sized here)
  JTokMActs* jtokm;   // JTok-M layers: routing and mixing; .aux set
  MoeActs* moe;       // MoE layers; .aux set
  // Optional (N,d): JTok-M's Delta_r is formed here, then added to h_out (the KV decode's recorded
  // bits); null: injected into h_out directly, as in training (the compiler may fuse the multiply and
  // the add there, rounding once less).
  float* jtokm_delta;
};

// How the caller runs the steps.
struct LayerKernels {
  RowKernel rows = RowKernel::fastest;  // every product of the layer (and the JTok-M router's)
  // RoPE positions: row i at pos[i] (decoding), or, with pos null, B sequences of T rows at 0..T-1.
  const int64_t* pos = nullptr;
  int64_t B = 0, T = 0;
  // A training forward recomputes a JTok layer's ungated mlp_out (s all 0: the plain model's path)
  // for the backward.
  bool keep_for_backward = false;
  RowSync row_sync;                 // as Activations::row_sync
  TableProvider* tables = nullptr;  // as Activations::tables (polled between steps)
};

// Layer l over N rows; ids: the rows' deduplicated token ids (JTok, JTok-M).
void layer_forward(const Model& m, int64_t l, const LayerBuffers& b, const RowBatch& ids, int64_t N,
                   const LayerKernels& k, const AttendFn& attend);

}  // namespace jtok
