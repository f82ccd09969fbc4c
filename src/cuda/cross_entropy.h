// Softmax cross-entropy on the GPU, src/ops/cross_entropy.h's contract (padded vocabulary: only
// columns < V take part; padded columns get zero gradient), and the fused LM head + cross-entropy
// that computes the logits a chunk of rows at a time, so the (B T, Vp) logits never exist whole.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/gemm_ref.h"

namespace jtok::cuda {

// logits (N,Vp) of T, targets (N) -> losses (N) fp32 = -log softmax(row)[target]; dlogits (N,Vp)
// = grad_scale * (softmax - onehot), padded columns 0, unless null; dlogits may alias logits (in
// place). One block a row: an online max / sum pass, then the gradient pass. The total loss:
// global_norm.h's sum_partials over losses (double, fixed order).
template <typename T>
void cross_entropy(T* dlogits, float* losses, const T* logits, const int32_t* targets, int64_t N, int64_t V,
                   int64_t Vp, float grad_scale, cudaStream_t stream);

// The LM head's three products (gemm_ref's signature: gemm_ref or cuBLASLt). out: logits and dh
// (C of T); acc: dW, accumulated in fp32 over the chunks.
template <typename T>
struct LmHeadGemms {
  GemmFn<T, T> out = gemm_ref<T, T>;
  GemmFn<T, float> acc = gemm_ref<T, float>;
};

// Fused LM head + cross-entropy, forward and backward, rows in chunks of chunk_rows:
//   logits (rows,Vp) = h (rows,C) @ W (Vp,C)^T;  losses, dlogits in place (cross_entropy above);
//   dh (rows,C) = dlogits @ W (overwritten);  dW (Vp,C) fp32 += dlogits^T @ h (unless null: frozen;
//   without add_to_dW the first chunk's product writes it over, its old values never read).
// logits_chunk: scratch (chunk_rows, Vp) of T. Chunks run in row order: dW's bits are fixed.
template <typename T>
void lm_head_cross_entropy(float* losses, T* dh, float* dW, const T* h, const T* W, const int32_t* targets, int64_t N,
                           int64_t C, int64_t V, int64_t Vp, float grad_scale, T* logits_chunk, int64_t chunk_rows,
                           const LmHeadGemms<T>& gemm, cudaStream_t stream, bool add_to_dW = true);

}  // namespace jtok::cuda
