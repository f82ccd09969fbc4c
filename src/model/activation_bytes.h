// What one micro-batch's activations (forward state kept for the backward, and the backward's
// scratch) take in memory, by component, so that a user can see what fits before a run
// (`jtok flops --micro-batch B --seq T`). Two ways of counting the same buffers:
// - activation_bytes(cfg, B, T): from the config alone. Token-table rows depend on the batch's
//   distinct ids; they are counted for the worst case, every id distinct (U = N, and JTok-M's
//   gathered rows S = N K), which real text stays well under.
// - measured_activation_bytes(acts): the sizes of the buffers a forward + backward allocated.
// tests/test_model.cpp holds the two equal on batches of distinct ids.
#pragma once
#include <cstdint>

#include "model/config.h"
#include "model/transformer.h"

namespace jtok {

struct ActivationBytes {
  int64_t residual = 0;   // residual stream, norms' inputs/outputs and their 1/rms, final norm
  int64_t attention = 0;  // q, k, v, attention output and its row log-sum-exp, their gradients
  int64_t mlp = 0;        // SwiGLU (dense) or MoE routing, grouped expert and shared expert buffers
  int64_t tables = 0;     // JTok / JTok-M: ids' dedup, gathered rows, router, mixed vectors
  int64_t logits = 0;     // (N, Vp) logits, reused in place for their gradient
  int64_t attention_probs_txt = 0;  // what the (B,H,T,T) probabilities of the old kernel would add
  int64_t total() const { return residual + attention + mlp + tables + logits; }
};

ActivationBytes activation_bytes(const ModelConfig& cfg, int64_t B, int64_t T);
ActivationBytes measured_activation_bytes(const Activations& acts, const ModelConfig& cfg);

}  // namespace jtok
