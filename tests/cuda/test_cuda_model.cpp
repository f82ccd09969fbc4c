// The whole model on the GPU (src/cuda/model.h) against the CPU engine's forward and backward
// (model/transformer.h) on the same weights and batch: the loss, the final normed hidden states and
// every gradient tensor by name (JTok, JTok-M: the tables' gradients and touched rows; JTok-M, MoE:
// the aux loss too), by normalised error ||gpu - cpu|| / ||cpu||; and 10 optimizer steps
// (src/cuda/model_optimizer.h against train/optimizer.cpp's optimizer_step, clipping on, the tables'
// deferred AdamW "dense" and "sparse") ending at the same weights and tables, also with two
// micro-batches a step and after a refused (non-finite) step. Runs only on a GPU
// host (in test_cuda_ops; bash scripts/test_cuda.sh).
//
// Tolerances (fp32): the GPU sums in other orders (cuBLASLt tiles, the flash attention's online
// softmax, per-block RMSNorm partials), so each value differs by a few fp32 roundings, compounded
// through 2 layers and the backward: loss 1e-5, hidden states and gradients 3e-5, weights after 10
// AdamW steps 1e-4 (Adam divides by sqrt(v): a gradient near 0 turns a small difference into a
// larger step). bf16 (activations and forward weights in bf16, fp32 masters and gradients): loose
// bounds against the fp32 CPU engine, loss 1e-2 and gradients 1e-1, that only a wrong op would miss;
// JTok-M's gradients with top-K = n_e (every_table_routed), its top-2 routing by the loss alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/model.h"
#include "cuda/model_optimizer.h"
#include "cuda_case.h"
#include "model/transformer.h"
#include "ops/adamw.h"
#include "train/config.h"
#include "train/optimizer.h"
#include "train/schedule.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::rel_err;
using bf16 = __nv_bfloat16;

// d 256, 2 layers, 4 heads / 2 kv heads (hd 64), vocab 250 padded to 256.
jtok::ModelConfig tiny_dense() {
  jtok::ModelConfig c;
  c.vocab_size = 250;
  c.hidden_size = 256;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 320;
  c.max_position_embeddings = 64;
  return c;
}

// Qwen3's shape: head_dim set apart from d (q_dim 256 != d 128), qk_norm, tied embeddings.
jtok::ModelConfig tiny_qwen3() {
  jtok::ModelConfig c = tiny_dense();
  c.hidden_size = 128;
  c.head_dim = 64;
  c.qk_norm = true;
  c.tie_word_embeddings = true;
  c.rope_theta = 1000000.0;
  return c;
}

// Qwen2's: q / k / v biases.
jtok::ModelConfig tiny_qwen2() {
  jtok::ModelConfig c = tiny_dense();
  c.attention_bias = true;
  return c;
}

// JTok on layer 1 (layer 0 plain): the gate on the MLP update, its scaler and table gradients.
jtok::ModelConfig tiny_jtok() {
  jtok::ModelConfig c = tiny_dense();
  c.jtok = true;
  c.jtok_layers = std::string("1");  // (a literal assigned here trips GCC 12's -Wrestrict false positive)
  return c;
}

// JTok-M on every layer (3 tables a layer, top 2), and the same beside JTok on layer 1.
jtok::ModelConfig tiny_jtokm() {
  jtok::ModelConfig c = tiny_dense();
  c.jtokm = true;
  c.jtokm_n_e = 3;
  c.jtokm_top_k = 2;
  c.jtokm_aux_loss_coef = 1e-2;  // large enough that its gradient shows in the router's
  return c;
}
jtok::ModelConfig tiny_jtok_jtokm() {
  jtok::ModelConfig c = tiny_jtokm();
  c.jtok = true;
  c.jtok_layers = std::string("1");
  return c;
}
// For the bf16 runs against the fp32 CPU: top-K = n_e, so every position routes to every table. The
// bf16 router logits differ from the CPU's by some tenths of a percent of their spread (by estimate:
// bf16 inputs through one or two layers), enough to flip a near-tie at the K-th place somewhere in
// 2 x 66 positions now and then, and a flipped choice moves that row's
// gradient (and touched flag) to another table: a test failure that is no kernel's fault. The
// top-K choice itself is dtype-free (fp32 logits, the same routing kernel), checked in fp32 above
// and in CudaOps.Jtokm; the weights still depend on every logit, so the router's gradient is live.
jtok::ModelConfig every_table_routed(jtok::ModelConfig c) {
  c.jtokm_top_k = c.jtokm_n_e;
  return c;
}

// MoE (DeepSeekMoE-style, model/moe.h): layer 0 dense, layer 1 the top 2 of 4 routed experts; then
// a shared expert beside them on every layer with the top-2 weights renormalised; and the latter
// with JTok-M on every layer and JTok on layer 1 (the MoE output gated). The aux loss coefficient is
// large enough that its gradient shows in the routers'.
jtok::ModelConfig tiny_moe() {
  jtok::ModelConfig c = tiny_dense();
  c.model_type = "jtok_moe";
  c.first_k_dense_replace = 1;
  c.n_routed_experts = 4;
  c.n_shared_experts = 0;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 96;
  c.router_aux_loss_coef = 1e-2;
  return c;
}
jtok::ModelConfig tiny_moe_shared() {
  jtok::ModelConfig c = tiny_moe();
  c.first_k_dense_replace = 0;
  c.n_shared_experts = 1;
  c.norm_topk_prob = true;
  return c;
}
jtok::ModelConfig tiny_moe_jtok_jtokm() {
  jtok::ModelConfig c = tiny_moe_shared();
  c.jtokm = true;
  c.jtokm_n_e = 3;
  c.jtokm_top_k = 2;
  c.jtokm_aux_loss_coef = 1e-2;
  c.jtok = true;
  c.jtok_layers = std::string("1");
  return c;
}
// The MoE bench's attention shape (configs/bench_moe.json: d 128 over 4 heads / 2 kv heads, hd 32,
// the GPU attention's smallest): dense, and MoE with a shared expert beside JTok-M on every layer.
jtok::ModelConfig tiny_hd32() {
  jtok::ModelConfig c = tiny_dense();
  c.hidden_size = 128;
  return c;
}
jtok::ModelConfig tiny_hd32_moe_jtokm() {
  jtok::ModelConfig c = tiny_moe_shared();
  c.hidden_size = 128;
  c.jtokm = true;
  c.jtokm_n_e = 3;
  c.jtokm_top_k = 2;
  c.jtokm_aux_loss_coef = 1e-2;
  return c;
}
// For bf16: every token takes all 4 experts (top 4 of 4), so no top-K choice can flip on a
// near-tie between bf16 and the fp32 CPU (a flipped token moves a row between experts: an O(1)
// change in their gradients that no tolerance would tell from a bug); the choice itself is checked
// in fp32.
jtok::ModelConfig tiny_moe_all_experts() {
  jtok::ModelConfig c = tiny_moe_shared();
  c.num_experts_per_tok = 4;
  c.norm_topk_prob = false;
  return c;
}

// make_model's weights with every 1-D tensor (gains 1, biases 0 at init) moved off its constant, so
// the gains and biases take part in the forward.
jtok::Model test_model(const jtok::ModelConfig& c) {
  jtok::Model m = jtok::make_model(c, 7);
  uint64_t seed = 100;
  for (const auto& p : m.layout) {
    if (p.shape.size() != 1) continue;
    const auto noise = jtok::testing::randn(static_cast<size_t>(p.numel), seed++, 0.2f);
    for (int64_t i = 0; i < p.numel; ++i) m.params[static_cast<size_t>(p.offset + i)] += noise[static_cast<size_t>(i)];
  }
  return m;
}

struct Batch {
  int64_t B = 2, T = 33;
  std::vector<int32_t> ids, targets;
};
Batch make_batch(const jtok::ModelConfig& c, uint64_t seed) {
  Batch b;
  b.ids = skewed_ids(b.B * b.T, c.vocab_size, seed);  // repeated ids: the embedding's row sums
  b.targets = skewed_ids(b.B * b.T, c.vocab_size, seed + 1);
  return b;
}

void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want, double tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i;
  const double err = rel_err(got, want);
  std::printf("cuda model %-52s err %.3e (tol %.1e)\n", what.c_str(), err, tol);
  EXPECT_LE(err, tol) << what;
}

// Every parameter tensor of the flat layout, by name.
void expect_tensors_close(const std::string& what, const jtok::Model& m, const std::vector<float>& got,
                          const float* want, double tol) {
  for (const auto& p : m.layout) {
    const auto lo = static_cast<size_t>(p.offset), hi = static_cast<size_t>(p.offset + p.numel);
    expect_close(what + " " + p.name, std::vector<float>(got.begin() + lo, got.begin() + hi),
                 std::vector<float>(want + lo, want + hi), tol);
  }
}

// Every token table's gradient (the CPU's row-sparse one made dense), and the rows flagged touched:
// exactly those with a CPU gradient row.
template <typename E>
void expect_table_grads_close(const std::string& name, const jtok::Model& m, const jtok::cuda::DeviceModel<E>& dm,
                              double tol) {
  const int64_t Vp = m.cfg.padded_vocab();
  for (size_t k = 0; k < m.tables.size(); ++k) {
    expect_close(name + " table grad " + m.table_names[k], jtok::cuda::download_table_grad(dm, static_cast<int64_t>(k)),
                 jtok::densify(m.table_grads[k], Vp), tol);
    const std::vector<uint8_t> touched = jtok::cuda::download_table_touched(dm, static_cast<int64_t>(k));
    for (int64_t r = 0; r < Vp; ++r)
      ASSERT_EQ(touched[static_cast<size_t>(r)] != 0, m.table_grads[k].slot[static_cast<size_t>(r)] >= 0)
          << m.table_names[k] << " row " << r;
  }
}

// The CPU engine's step on m: the loss; m.grads, acts.lnf hold the rest.
double cpu_step(jtok::Model& m, jtok::Activations& acts, const Batch& b) {
  jtok::zero_grads(m);
  jtok::forward(m, acts, b.ids.data(), b.B, b.T);
  return jtok::backward(m, acts, b.ids.data(), b.targets.data());
}

// The GPU's step on a device copy of m (LM head in chunks of 24 rows: 24 + 24 + 18).
template <typename E>
void expect_gpu_step_matches(const std::string& name, const jtok::ModelConfig& c, double tol_loss, double tol) {
  jtok::Model m = test_model(c);
  const Batch b = make_batch(c, 11);
  jtok::Activations acts;
  const double cpu_loss = cpu_step(m, acts, b);
  jtok::cuda::DeviceModel<E> dm(m);
  jtok::cuda::DeviceActs<E> da;
  jtok::cuda::ensure_device_activations(da, dm, b.B, b.T, 24);
  jtok::cuda::forward(dm, da, b.ids.data(), b.B, b.T);
  const double eval_loss = jtok::cuda::forward_loss(dm, da, b.targets.data());
  const double loss = jtok::cuda::backward(dm, da, b.targets.data());
  expect_close(name + " loss", {static_cast<float>(loss)}, {static_cast<float>(cpu_loss)}, tol_loss);
  expect_close(name + " loss (forward_loss)", {static_cast<float>(eval_loss)}, {static_cast<float>(cpu_loss)},
               tol_loss);
  if (acts.jtokm_aux_loss != 0)
    expect_close(name + " jtokm aux loss", {static_cast<float>(jtok::cuda::jtokm_aux_loss(dm, da))},
                 {static_cast<float>(acts.jtokm_aux_loss)}, tol_loss);
  if (c.moe_num_layers() > 0) {
    EXPECT_GT(acts.moe_aux_loss, 0.0) << name;
    expect_close(name + " moe aux loss", {static_cast<float>(jtok::cuda::moe_aux_loss(dm, da))},
                 {static_cast<float>(acts.moe_aux_loss)}, tol_loss);
  }
  std::vector<float> lnf(acts.lnf.size());
  if constexpr (sizeof(E) == 4) {
    jtok::cuda::copy_to_host(lnf.data(), da.lnf.get(), da.lnf.size(), dm.stream);
    expect_close(name + " lnf", lnf, acts.lnf, tol);
  }
  expect_tensors_close(name + " grad", m, jtok::cuda::download_grads(dm), m.grads.data(), tol);
  expect_table_grads_close(name, m, dm, tol);
}

// The forward alone (loss and JTok-M's aux loss), for bf16 runs whose gradients a flipped near-tie
// may move (top-K < n_e): one position's choice moves the loss by far less than the tolerance.
template <typename E>
void expect_gpu_loss_matches(const std::string& name, const jtok::ModelConfig& c, double tol_loss) {
  jtok::Model m = test_model(c);
  const Batch b = make_batch(c, 11);
  jtok::Activations acts;
  const double cpu_loss = cpu_step(m, acts, b);
  jtok::cuda::DeviceModel<E> dm(m);
  jtok::cuda::DeviceActs<E> da;
  jtok::cuda::forward(dm, da, b.ids.data(), b.B, b.T);
  const double loss = jtok::cuda::forward_loss(dm, da, b.targets.data());
  expect_close(name + " loss (forward_loss)", {static_cast<float>(loss)}, {static_cast<float>(cpu_loss)}, tol_loss);
  expect_close(name + " jtokm aux loss", {static_cast<float>(jtok::cuda::jtokm_aux_loss(dm, da))},
               {static_cast<float>(acts.jtokm_aux_loss)}, tol_loss);
}

// The GPU model's refusals name what it does not run: low-precision (exported, inference-only)
// weights, in either instantiation.
TEST(CudaModel, RefusesWhatIsNotOnTheGpu) {
  jtok::Model m = test_model(tiny_jtokm());
  m.lowp.dtype = jtok::Dtype::bf16;  // what loading a `jtok export --weight-dtype bf16` checkpoint sets
  for (int fp32 = 0; fp32 < 2; ++fp32) {
    try {
      if (fp32) {
        jtok::cuda::DeviceModel<float> dm(m);
      } else {
        jtok::cuda::DeviceModel<bf16> dm(m);
      }
      FAIL() << "a model with low-precision weights was accepted";
    } catch (const jtok::Error& e) {
      EXPECT_NE(std::string(e.what()).find("low-precision"), std::string::npos) << e.what();
    }
  }
}

// And an MoE top-K beyond the kernels' bound, by its field.
TEST(CudaModel, RefusesMoeTopKPastTheKernelsBound) {
  jtok::ModelConfig c = tiny_moe();
  c.n_routed_experts = jtok::cuda::kMoeMaxTopK + 2;
  c.num_experts_per_tok = jtok::cuda::kMoeMaxTopK + 1;
  c.moe_intermediate_size = 8;
  const jtok::Model m = test_model(c);
  try {
    jtok::cuda::DeviceModel<float> dm(m);
    FAIL() << "an MoE model of top " << c.num_experts_per_tok << " was accepted";
  } catch (const jtok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_experts_per_tok 33"), std::string::npos) << e.what();
  }
}

TEST(CudaModel, DenseStepMatchesCpu) { expect_gpu_step_matches<float>("dense fp32", tiny_dense(), 1e-5, 3e-5); }
TEST(CudaModel, Qwen3StepMatchesCpu) { expect_gpu_step_matches<float>("qwen3 fp32", tiny_qwen3(), 1e-5, 3e-5); }
TEST(CudaModel, Qwen2BiasStepMatchesCpu) { expect_gpu_step_matches<float>("qwen2 fp32", tiny_qwen2(), 1e-5, 3e-5); }
TEST(CudaModel, JtokStepMatchesCpu) { expect_gpu_step_matches<float>("jtok fp32", tiny_jtok(), 1e-5, 3e-5); }
TEST(CudaModel, JtokmStepMatchesCpu) { expect_gpu_step_matches<float>("jtokm fp32", tiny_jtokm(), 1e-5, 3e-5); }
TEST(CudaModel, JtokAndJtokmStepMatchesCpu) {
  expect_gpu_step_matches<float>("jtok+jtokm fp32", tiny_jtok_jtokm(), 1e-5, 3e-5);
}
TEST(CudaModel, MoeStepMatchesCpu) {
  expect_gpu_step_matches<float>("moe fp32", tiny_moe(), 1e-5, 3e-5);
  expect_gpu_step_matches<float>("moe shared fp32", tiny_moe_shared(), 1e-5, 3e-5);
}
TEST(CudaModel, MoeJtokJtokmStepMatchesCpu) {
  expect_gpu_step_matches<float>("moe+jtok+jtokm fp32", tiny_moe_jtok_jtokm(), 1e-5, 3e-5);
}
TEST(CudaModel, HeadDim32StepMatchesCpu) {
  ASSERT_EQ(tiny_hd32().hd(), 32);
  expect_gpu_step_matches<float>("hd32 fp32", tiny_hd32(), 1e-5, 3e-5);
  expect_gpu_step_matches<float>("hd32 moe+jtokm fp32", tiny_hd32_moe_jtokm(), 1e-5, 3e-5);
  expect_gpu_step_matches<bf16>("hd32 bf16", tiny_hd32(), 1e-2, 1e-1);
}
TEST(CudaModel, Bf16StepNearCpu) {
  expect_gpu_step_matches<bf16>("dense bf16", tiny_dense(), 1e-2, 1e-1);
  expect_gpu_step_matches<bf16>("qwen3 bf16", tiny_qwen3(), 1e-2, 1e-1);
  expect_gpu_step_matches<bf16>("jtok bf16", tiny_jtok(), 1e-2, 1e-1);
  expect_gpu_step_matches<bf16>("jtokm bf16", every_table_routed(tiny_jtokm()), 1e-2, 1e-1);
  expect_gpu_step_matches<bf16>("jtok+jtokm bf16", every_table_routed(tiny_jtok_jtokm()), 1e-2, 1e-1);
  expect_gpu_loss_matches<bf16>("jtokm top-2 bf16", tiny_jtokm(), 1e-2);
}
TEST(CudaModel, MoeBf16StepNearCpu) {
  expect_gpu_step_matches<bf16>("moe all experts bf16", tiny_moe_all_experts(), 1e-2, 1e-1);
}

// Two GPU steps on the same inputs give the same gradient bits (no atomics decide them).
void expect_step_deterministic(const jtok::ModelConfig& c) {
  const jtok::Model m = test_model(c);
  const Batch b = make_batch(c, 12);
  jtok::cuda::DeviceModel<float> dm(m);
  jtok::cuda::DeviceActs<float> da;
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    jtok::cuda::zero_grads(dm);
    jtok::cuda::forward(dm, da, b.ids.data(), b.B, b.T);
    jtok::cuda::backward(dm, da, b.targets.data());
    const std::vector<float> g = jtok::cuda::download_grads(dm);
    if (run == 0) {
      first = g;
    } else {
      EXPECT_EQ(0, std::memcmp(first.data(), g.data(), g.size() * sizeof(float)));
    }
  }
}
TEST(CudaModel, StepIsDeterministic) { expect_step_deterministic(tiny_qwen3()); }
TEST(CudaModel, MoeStepIsDeterministic) { expect_step_deterministic(tiny_moe_shared()); }

// The step's AdamW constants as the CPU's optimizer_step forms them (lr at the step before it; the
// token-indexed modules at their own lr).
jtok::cuda::AdamWConsts step_consts(const jtok::TrainConfig& t, double lr, int64_t step, bool decay) {
  const jtok::AdamWHyper h{static_cast<float>(lr), static_cast<float>(t.adam_beta1), static_cast<float>(t.adam_beta2),
                           static_cast<float>(t.adam_epsilon), decay ? static_cast<float>(t.weight_decay) : 0.0f,
                           step + 1, 1.0f};
  const jtok::AdamWStepConsts k = jtok::adamw_consts(h);
  return {k.b1, k.b2, k.eps, k.step_size, k.inv_sqrt_bc2, k.decay};
}
jtok::cuda::StepConsts step_consts(const jtok::TrainConfig& t, int64_t step) {
  const double lr = jtok::lr_at(t, step);
  const double table_lr = t.table_learning_rate < 0 ? lr : lr * (t.table_learning_rate / t.learning_rate);
  return {step_consts(t, lr, step, true), step_consts(t, lr, step, false), step_consts(t, table_lr, step, true),
          step_consts(t, table_lr, step, false)};
}

// How the steps run: micro-batches a step (each its own batch, grad_scale 1/micro: the trainer's
// accumulation), and a refused step: a NaN written into a touched gradient row of table 0 on both
// devices after the backward, both optimizers refuse the step (nothing moves), the next step starts
// from zero_grads (the GPU: the flagged rows cleared, no whole-table memset) and its table gradients
// must equal the CPU's, which zeroes everything: no row of the refused step leaks into them.
struct StepPlan {
  int micro = 1;
  int64_t refuse_at = -1;  // the loop step (0-based) that is poisoned and refused; -1: none
  bool frozen_backbone = false;  // --train-only tables
};

// One step's micro-batches on both devices from zeroed gradients; the mean losses (CPU, GPU).
std::pair<double, double> run_micro_batches(jtok::Model& m, jtok::Activations& acts, jtok::cuda::DeviceModel<float>& dm,
                                            jtok::cuda::DeviceActs<float>& da, const std::vector<Batch>& bs) {
  jtok::zero_grads(m);
  jtok::cuda::zero_grads(dm);
  const float scale = 1.0f / static_cast<float>(bs.size());
  double cpu = 0, gpu = 0;
  for (const Batch& b : bs) {
    jtok::forward(m, acts, b.ids.data(), b.B, b.T);
    cpu += jtok::backward(m, acts, b.ids.data(), b.targets.data(), scale) * scale;
    jtok::cuda::forward(dm, da, b.ids.data(), b.B, b.T);
    gpu += jtok::cuda::backward(dm, da, b.targets.data(), scale) * scale;
  }
  return {cpu, gpu};
}

// A NaN in table 0's first touched gradient row on both devices; then both optimizers refuse the step.
void expect_refused(jtok::Model& m, jtok::AdamWState& state, const jtok::TrainConfig& t,
                    jtok::cuda::DeviceModel<float>& dm, jtok::cuda::DeviceAdamW& opt, const jtok::cuda::StepConsts& k) {
  ASSERT_GT(m.tables.size(), 0u) << "a refused table row needs a table";
  const auto& slot = m.table_grads[0].slot;
  const auto r = std::find_if(slot.begin(), slot.end(), [](int32_t s) { return s >= 0; }) - slot.begin();
  ASSERT_LT(r, static_cast<int64_t>(slot.size())) << "table 0 has no touched row";
  const float nan = std::numeric_limits<float>::quiet_NaN();
  m.table_grads[0].row(static_cast<int32_t>(r))[0] = nan;
  JTOK_CUDA_CHECK(cudaStreamSynchronize(dm.stream));
  jtok::cuda::copy_to_device(dm.table_grad(0) + r * dm.cfg.hidden_size, &nan, 1);
  EXPECT_THROW(jtok::optimizer_step(m, state, t), jtok::Error);
  EXPECT_THROW(jtok::cuda::optimizer_step(dm, opt, k, static_cast<float>(t.max_grad_norm)), jtok::Error);
}

// 10 steps (a new batch each, warmup then cosine, clipping at a norm the gradients exceed) on both
// devices from the same weights: the losses and norms step by step, the weights at the end (and the
// tables, brought current on both sides).
void expect_ten_steps_match(const std::string& name, const jtok::ModelConfig& c, const jtok::TrainConfig& t,
                            StepPlan plan = {}) {
  jtok::Model m = test_model(c);
  m.backbone_frozen = plan.frozen_backbone;  // before the optimizer states: frozen tensors get no moments
  jtok::cuda::DeviceModel<float> dm(m);
  jtok::cuda::DeviceActs<float> da;
  jtok::cuda::DeviceAdamW opt(dm, t.table_optimizer != "sparse");
  da.row_sync = jtok::cuda::table_row_sync(dm, opt);
  jtok::AdamWState state = jtok::make_adamw_state(m);
  jtok::Activations acts;
  acts.row_sync = jtok::table_row_sync(m, state);
  for (int64_t step = 0; step < t.max_steps; ++step) {
    std::vector<Batch> bs;
    for (int i = 0; i < plan.micro; ++i)
      bs.push_back(make_batch(c, 1000 + static_cast<uint64_t>(step * plan.micro + i)));
    const auto [cpu_loss, loss] = run_micro_batches(m, acts, dm, da, bs);
    const std::string at = name + " step " + std::to_string(step + 1);
    expect_close(at + " loss", {static_cast<float>(loss)}, {static_cast<float>(cpu_loss)}, 1e-4);
    if (plan.refuse_at == 0 && step == 1)  // the weights still the start's: the one-step tolerance holds
      expect_table_grads_close(at + " after a refused step", m, dm, 3e-5);
    if (step == plan.refuse_at) {
      expect_refused(m, state, t, dm, opt, step_consts(t, state.step));
      continue;
    }
    const jtok::StepStats st = jtok::optimizer_step(m, state, t);
    const double norm = jtok::cuda::optimizer_step(dm, opt, step_consts(t, state.step - 1),
                                                   static_cast<float>(t.max_grad_norm));
    expect_close(at + " grad norm", {static_cast<float>(norm)}, {static_cast<float>(st.grad_norm)}, 1e-4);
    if (state.step == 1) {
      EXPECT_LT(st.clip_coef, 1.0) << "the test means to exercise clipping";
    }
  }
  jtok::sync_tables(m, state);
  jtok::cuda::sync_tables(dm, opt);
  expect_tensors_close(name + " 10 steps param", m, jtok::cuda::download_params(dm), m.params.data(), 1e-4);
  for (size_t k = 0; k < m.tables.size(); ++k)
    expect_close(name + " 10 steps table " + m.table_names[k], jtok::cuda::download_table(dm, static_cast<int64_t>(k)),
                 m.tables[k].to_vector(), 1e-4);
}

jtok::TrainConfig ten_steps() {
  jtok::TrainConfig t;
  t.max_steps = 10;
  t.warmup_steps = 3;
  t.learning_rate = 3e-3;
  t.max_grad_norm = 0.2;
  return t;
}

// --train-only tables: only the tables, scalers and routers move; the backbone's weights stay put
// on both devices (the GPU zeroes their gradients before the norm).
TEST(CudaModel, TenAdamWStepsFrozenBackboneMatchCpu) {
  jtok::TrainConfig t = ten_steps();
  t.table_learning_rate = 1e-2;
  t.max_grad_norm = 1e-3;  // the tables' and scalers' gradients alone: still clipped
  expect_ten_steps_match("adamw frozen backbone jtok+jtokm", tiny_jtok_jtokm(), t, StepPlan{1, -1, true});
}

TEST(CudaModel, TenAdamWStepsMatchCpu) { expect_ten_steps_match("adamw qwen3", tiny_qwen3(), ten_steps()); }

// With JTok and JTok-M tables, the token-indexed modules at their own lr, dense and sparse.
void expect_table_steps_match(const std::string& name, StepPlan plan = {}, int64_t steps = 10) {
  for (const char* mode : {"dense", "sparse"}) {
    jtok::TrainConfig t = ten_steps();
    t.table_optimizer = mode;
    t.table_learning_rate = 1e-2;
    t.max_steps = steps;
    expect_ten_steps_match(name + " " + mode, tiny_jtok_jtokm(), t, plan);
  }
}

// The deferred exact table AdamW ("dense": rows without a gradient replayed when read) and "sparse".
TEST(CudaModel, TenAdamWStepsWithTablesMatchCpu) { expect_table_steps_match("adamw jtok+jtokm"); }

// Two micro-batches a step whose ids differ (rows touched by one micro-batch only: accumulated into
// the dense gradient, listed once by the step).
TEST(CudaModel, TenAdamWStepsOfTwoMicroBatchesMatchCpu) {
  const Batch b0 = make_batch(tiny_jtok_jtokm(), 1000), b1 = make_batch(tiny_jtok_jtokm(), 1001);
  EXPECT_TRUE(std::any_of(b1.ids.begin(), b1.ids.end(), [&](int32_t id) {
    return std::find(b0.ids.begin(), b0.ids.end(), id) == b0.ids.end();
  })) << "the test means some ids to be in the second micro-batch only";
  expect_table_steps_match("adamw 2 micro-batches", StepPlan{2, -1});
}

// A refused step (a NaN in a table's gradient), then 10 applied: first, the step after it has the
// CPU's table gradients and flags (the refused step's rows cleared by zero_grads); fifth (rows
// deferred, moments warm): the run ends where the CPU's does.
TEST(CudaModel, RefusedStepLeavesCleanGradients) {
  expect_table_steps_match("adamw refused first step", StepPlan{1, 0}, 11);
  expect_table_steps_match("adamw refused fifth step", StepPlan{1, 4}, 11);
}

// MoE (the routers' aux loss in every step's gradient), and MoE beside JTok and JTok-M tables.
TEST(CudaModel, TenAdamWStepsWithMoeMatchCpu) {
  expect_ten_steps_match("adamw moe", tiny_moe(), ten_steps());
  jtok::TrainConfig t = ten_steps();
  t.table_learning_rate = 1e-2;
  expect_ten_steps_match("adamw moe+jtok+jtokm dense", tiny_moe_jtok_jtokm(), t);
}

}  // namespace
