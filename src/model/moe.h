// DeepSeekMoE-style block (docs/model.md "MoE"): shared experts plus the top-k of E routed experts,
// every expert a SwiGLU. The router is softmax over all routed experts; the top-k selection is a
// constant of the backward (gradients flow through the selected probabilities only), and a
// switch-style load-balancing loss aux = coef * E * sum_i f_i P_i adds gradient through P.
//
// The fast path groups the routed slots by expert (counting sort), gathers each expert's tokens
// into one contiguous block and runs one GEMM per expert and projection; the reference works
// token by token in double.
//
// Inference copies (`jtok export --weight-dtype`) may hold the experts in bf16 / int8 (MoeLowp):
// moe_forward reads every expert matrix through moe_matrix and multiplies low-precision ones with
// linear_forward_lowp; fp32 matrices take the very calls of the training path (linear_forward, gemm).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "ops/lowp_linear.h"

namespace jtok {

struct MoeDims {
  int64_t d = 0, E = 0, K = 0;  // hidden size, routed experts, experts per token
  int64_t F = 0;                // each routed expert's SwiGLU inner size
  int64_t S = 0;                // shared experts' inner size (n_shared * F), 0 = none
  bool norm_topk = false;       // renormalise the top-k probabilities to sum 1
  double aux_coef = 0;          // router_aux_loss_coef
};
MoeDims moe_dims(const ModelConfig& c);

// One block's tensors inside a flat buffer (weights, or their gradients alike).
struct MoeWeights {
  float* router = nullptr;                          // (E,d)   mlp.gate.weight
  float *sg = nullptr, *su = nullptr, *sd = nullptr;  // (S,d), (S,d), (d,S): shared experts; null when S = 0
  float* experts = nullptr;  // E experts back to back, each gate (F,d), up (F,d), down (d,F)
};
inline float* expert_gate(const MoeWeights& w, const MoeDims& m, int64_t e) { return w.experts + e * 3 * m.F * m.d; }
inline float* expert_up(const MoeWeights& w, const MoeDims& m, int64_t e) { return expert_gate(w, m, e) + m.F * m.d; }
inline float* expert_down(const MoeWeights& w, const MoeDims& m, int64_t e) { return expert_gate(w, m, e) + 2 * m.F * m.d; }

// Inference-only low-precision experts of one MoE block (model/lowp_weights.h); a matrix whose data
// is null is read from the fp32 MoeWeights. The router is never low precision.
enum class ExpertProj { gate, up, down };
struct MoeLowp {
  std::array<WeightMatrix, 3> shared;              // gate (S,d), up (S,d), down (d,S)
  std::vector<std::array<WeightMatrix, 3>> routed;  // per routed expert (empty: all fp32)
};
// The matrix the forward multiplies for expert e (-1: the shared experts) and projection p: lp's
// where it has one, else a view of w's fp32 tensor.
WeightMatrix moe_matrix(const MoeWeights& w, const MoeDims& m, const MoeLowp* lp, int64_t e, ExpertProj p);

// What the backward needs, for N positions. A "slot" is (position n, choice j), index n*K + j;
// a "row" is a slot's place in the expert-grouped block.
struct MoeActs {
  std::vector<float> probs;        // (N,E) router softmax
  std::vector<int32_t> topi;       // (N,K) chosen experts: descending probability, ties to the lower index
  std::vector<float> topw;         // (N,K) their weights
  std::vector<int32_t> offsets;    // (E+1) expert e owns rows offsets[e] .. offsets[e+1]-1
  std::vector<int32_t> slot_of;    // (N*K) row -> slot
  std::vector<int32_t> row_of;     // (N*K) slot -> row
  std::vector<float> frac;         // (E) f_i = tokens routed to i / (N*K)
  std::vector<float> xg, g, u, act, eo;  // grouped: (NK,d) input, (NK,F) gate, up, silu*up, (NK,d) output
  std::vector<float> sg, su, sact;       // shared: (N,S) each
  double aux = 0;                  // this block's aux loss (coef included)
};
struct MoeScratch {
  std::vector<float> deo, dact, dg, du, dxg, dprobs, dsact, dsg, dsu;
};

// out (N,d) += shared(x) + sum_j topw[n,j] * expert_{topi[n,j]}(x_n); x (N,d). Sets a.aux. lp: the
// block's low-precision experts (inference only; null, as in training: all fp32). rk per_row
// (decoding): the router and every expert by the per-row kernels, so a row's output does not depend
// on the other rows (nor on how many share its experts).
void moe_forward(float* out, MoeActs& a, const float* x, const MoeWeights& w, const MoeDims& m, int64_t N,
                 const MoeLowp* lp = nullptr, RowKernel rk = RowKernel::fastest);
// From dout = dL/d(block output) (N,d): dx (N,d) += dL/dx, g += weight gradients (g's pointers null:
// none, a frozen block whose weight-gradient GEMMs are skipped). aux_grad is
// dL/d(a.aux) (the loss's weight on this block's aux term; 0 ignores the aux loss).
void moe_backward(float* dx, const MoeWeights& g, MoeScratch& s, const float* dout, const float* x, const MoeActs& a,
                  const MoeWeights& w, const MoeDims& m, int64_t N, float aux_grad);

// References: token by token, double accumulation, same routing rule. Return the aux loss.
double moe_forward_ref(float* out, const float* x, const MoeWeights& w, const MoeDims& m, int64_t N);
void moe_backward_ref(float* dx, const MoeWeights& g, const float* dout, const float* x, const MoeWeights& w,
                      const MoeDims& m, int64_t N, float aux_grad);

}  // namespace jtok
