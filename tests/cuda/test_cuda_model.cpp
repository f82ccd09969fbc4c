// The whole model on the GPU (src/cuda/model.h) against the CPU engine's forward and backward
// (model/transformer.h) on the same weights and batch: the loss, the final normed hidden states and
// every gradient tensor by name (JTok, JTok-M: the tables' gradients and touched rows; JTok-M, MoE:
// the aux loss too), by normalised error ||gpu - cpu|| / ||cpu|| (the optimizer steps:
// test_cuda_model_steps.cpp). Runs only on a GPU host (in test_cuda_ops; bash scripts/test_cuda.sh).
//
// Tolerances (fp32): the GPU sums in other orders (cuBLASLt tiles, the flash attention's online
// softmax, per-block RMSNorm partials), so each value differs by a few fp32 roundings, compounded
// through 2 layers and the backward: loss 1e-5, hidden states and gradients 3e-5. bf16 (activations
// and forward weights in bf16, fp32 masters and gradients): loose bounds against the fp32 CPU
// engine, loss 1e-2 and gradients 1e-1, that only a wrong op would miss; JTok-M's gradients with
// top-K = n_e (every_table_routed), its top-2 routing by the loss alone.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/model.h"
#include "model/transformer.h"
#include "model_case.h"

namespace {

using namespace jtok::cuda_test;
using bf16 = __nv_bfloat16;

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
    expect_close(name + " jtokm aux loss", {static_cast<float>(jtok::cuda::jtokm_routing(dm, da).aux)},
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
  expect_close(name + " jtokm aux loss", {static_cast<float>(jtok::cuda::jtokm_routing(dm, da).aux)},
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

// Training reads q | k | v and gate | up as one weight each: one (N, qd + 2 kvd) buffer for q | k | v
// and one for their gradients (qk_norm: a second for the product, before the norms of q and k), one
// (N, 2F) buffer for gate | up and one for theirs; the step cases below check each model against the
// CPU. A layout without them back to back is refused by layer and name.
TEST(CudaModel, FusedProductsAndTheirLayout) {
  for (const jtok::ModelConfig& c : {tiny_dense(), tiny_qwen2(), tiny_qwen3()}) {
    const jtok::Model m = test_model(c);
    jtok::cuda::DeviceModel<float> dm(m);
    jtok::cuda::DeviceActs<float> acts;
    jtok::cuda::ensure_device_activations(acts, dm, 2, 8);
    const int64_t N = 16, W = c.q_dim() + 2 * c.kv_dim(), F = c.intermediate_size;
    EXPECT_EQ(acts.layers[0].q.size(), N * W) << "qk_norm " << c.qk_norm;
    EXPECT_EQ(acts.layers[0].q_in.size(), c.qk_norm ? N * W : 0);
    EXPECT_EQ(acts.dq.size(), N * W);
    EXPECT_EQ(acts.layers[0].gate.size(), N * 2 * F);
    EXPECT_EQ(acts.dgate.size(), N * 2 * F);
  }
  jtok::Model m = test_model(tiny_qwen3());
  std::swap(m.w.layers[1].wk, m.w.layers[1].wv);
  try {
    jtok::cuda::DeviceModel<float> dm(m);
    FAIL() << "a layer with k after v was accepted";
  } catch (const jtok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda model: layer 1's q, k and v"), std::string::npos) << e.what();
  }
}

TEST(CudaModel, DenseStepMatchesCpu) { expect_gpu_step_matches<float>("dense fp32", tiny_dense(), 1e-5, 3e-5); }
TEST(CudaModel, Qwen3StepMatchesCpu) { expect_gpu_step_matches<float>("qwen3 fp32", tiny_qwen3(), 1e-5, 3e-5); }
TEST(CudaModel, Llama3StepMatchesCpu) { expect_gpu_step_matches<float>("llama3 fp32", tiny_llama3(), 1e-5, 3e-5); }
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

// A bf16 step's loss and gradients with the attention at 16 query rows a warp, at 32, and at what the
// model times and picks on its first forward (cuda/attention_rows.h): the same bits. hd 32 (the tiny
// models' hd 16 has no tensor-core kernels; hd 128 no 32-row ones).
TEST(CudaModel, AttentionRowsGiveTheSameStep) {
  const jtok::ModelConfig c = tiny_hd32();
  const jtok::Model m = test_model(c);
  const Batch b = make_batch(c, 13);
  std::vector<float> first;
  double first_loss = 0;
  for (const jtok::cuda::AttentionRows rows : {jtok::cuda::AttentionRows{16, 16}, jtok::cuda::AttentionRows{32, 32},
                                               jtok::cuda::AttentionRows{16, 32}, jtok::cuda::AttentionRows{}}) {
    jtok::cuda::DeviceModel<bf16> dm(m);
    jtok::cuda::DeviceActs<bf16> da;
    dm.attn_rows = rows;
    jtok::cuda::zero_grads(dm);
    jtok::cuda::forward(dm, da, b.ids.data(), b.B, b.T);
    const double loss = jtok::cuda::backward(dm, da, b.targets.data());
    const std::vector<float> g = jtok::cuda::download_grads(dm);
    const std::string at = "rows " + std::to_string(rows.fwd) + " / " + std::to_string(rows.bwd);
    if (rows.fwd == 0) {  // picked: both timed, 16 or 32 each
      EXPECT_TRUE(dm.attn_rows.fwd == 16 || dm.attn_rows.fwd == 32) << dm.attn_rows.fwd;
      EXPECT_TRUE(dm.attn_rows.bwd == 16 || dm.attn_rows.bwd == 32) << dm.attn_rows.bwd;
      for (int i = 0; i < 2; ++i) EXPECT_GT(dm.attn_rows.fwd_ms[i] * dm.attn_rows.bwd_ms[i], 0.0) << i;
    }
    if (first.empty()) {
      first = g, first_loss = loss;
      continue;
    }
    EXPECT_EQ(first_loss, loss) << at;
    EXPECT_EQ(0, std::memcmp(first.data(), g.data(), g.size() * sizeof(float))) << at;
  }
}
TEST(CudaModel, MoeStepIsDeterministic) { expect_step_deterministic(tiny_moe_shared()); }

}  // namespace
