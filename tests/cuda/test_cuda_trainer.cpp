// The device trainer (src/cuda/training.h, what `jtok train --device cuda` runs) and the bf16 model's
// copies. Trainer: made from a host state 3 CPU steps in (warm moments, every row current at step 3:
// upload_moments' row steps and kept base), it runs 5 steps through the trainer's own calls (an
// evaluation between them: its row syncs move no value) beside the CPU's, and writes back weights,
// tables and moments that match the CPU's. bf16: after every step (deferred "dense" rows, an
// evaluation's row syncs, "dense-eager", a frozen backbone) each bf16 copy is exactly the bf16 rounding
// of its fp32 master, the flat weights' and every table row's (a deferred row's stale copy included:
// stale with its master). A NaN gradient injected with a frozen backbone is refused. The device memory
// a step holds stays within `train --device cuda`'s plan; its phase profile names every phase and
// changes no bits. Runs on a GPU host (in test_cuda_ops; bash
// scripts/test_cuda.sh) and on the CPU's emulation (tests/cuda/emulate_kernels.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/device.h"
#include "cuda/model.h"
#include "cuda/model_optimizer.h"
#include "cuda/training.h"
#include "model_case.h"
#include "scaling/memory_plan.h"
#include "step_case.h"
#include "train/optimizer.h"
#include "train/tables_cuda.h"
#include "train/telemetry.h"

namespace {

using namespace jtok::cuda_test;

double cpu_train_step(jtok::Model& m, jtok::Activations& acts, jtok::AdamWState& state, const jtok::TrainConfig& t,
                      const Batch& b, double* norm) {
  jtok::zero_grads(m);
  jtok::forward(m, acts, b.ids.data(), b.B, b.T);
  const double loss = jtok::backward(m, acts, b.ids.data(), b.targets.data(), 1.0f);
  *norm = jtok::optimizer_step(m, state, t).grad_norm;
  return loss;
}

// The device's telemetry against the CPU forward's (train/telemetry.h): the hidden-state spread
// (when asked) within 1e-4, each JTok-M layer's per-table counts within one position (a near tie of
// router logits may fall the other way) and their sum exact, the summed weights within 1e-3.
void expect_telemetry(const std::string& at, const jtok::cuda::MicroBatchLoss& got, const jtok::Activations& acts,
                      const jtok::Model& m, bool hidden_std) {
  if (hidden_std) {
    const double cpu = jtok::hidden_state_std(acts);
    EXPECT_NEAR(got.hidden_std, cpu, 1e-4 * cpu) << at << " hidden_std";
  }
  jtok::RoutingStats cpu(m), gpu(m);
  cpu.add(acts);
  gpu.add(got.jtokm_load, got.jtokm_weight_sum);
  ASSERT_FALSE(cpu.layers.empty()) << at;
  for (size_t k = 0; k < cpu.layers.size(); ++k) {
    double n_cpu = 0, n_gpu = 0;
    for (size_t i = 0; i < cpu.load[k].size(); ++i) {
      EXPECT_NEAR(gpu.load[k][i], cpu.load[k][i], 1.0) << at << " layer " << cpu.layers[k] << " table " << i;
      EXPECT_NEAR(gpu.wsum[k][i], cpu.wsum[k][i], 1e-3 * (1.0 + cpu.wsum[k][i])) << at << " weights, table " << i;
      n_cpu += cpu.load[k][i], n_gpu += gpu.load[k][i];
    }
    EXPECT_EQ(n_gpu, n_cpu) << at << " layer " << cpu.layers[k];
  }
}

// The host state after 3 CPU steps (rows current), the trainer made from it, 5 more steps on both.
void expect_trainer_matches_cpu(const std::string& mode) {
  const jtok::ModelConfig c = tiny_jtok_jtokm();
  jtok::TrainConfig t = ten_steps();
  t.table_optimizer = mode;
  t.table_learning_rate = 1e-2;
  jtok::Model m = test_model(c);
  jtok::AdamWState state = jtok::make_adamw_state(m);
  jtok::Activations acts;
  acts.row_sync = jtok::table_row_sync(m, state);
  double norm = 0;
  for (int64_t s = 0; s < 3; ++s)
    cpu_train_step(m, acts, state, t, make_batch(c, 2000 + static_cast<uint64_t>(s)), &norm);
  jtok::sync_tables(m, state);  // as a checkpoint's: every row current at step 3
  jtok::AdamWState gstate = state;
  const auto dev = jtok::cuda::make_device_trainer(m, jtok::host_adamw_view(gstate), false,
                                                   {mode != "sparse", mode == "dense-eager"});
  for (int64_t s = 3; s < 8; ++s) {
    const Batch b = make_batch(c, 2000 + static_cast<uint64_t>(s));
    const std::string at = "trainer " + mode + " step " + std::to_string(s + 1);
    const double cpu_loss = cpu_train_step(m, acts, state, t, b, &norm);
    dev->zero_grads();
    const jtok::cuda::MicroBatchLoss got = dev->forward_backward(b.ids.data(), b.targets.data(), b.B, b.T, 1.0f, s == 3);
    const double loss = got.loss;
    expect_telemetry(at, got, acts, m, s == 3);
    const double gnorm = jtok::device_optimizer_step(*dev, gstate, t).grad_norm;
    expect_close(at + " loss", {static_cast<float>(loss)}, {static_cast<float>(cpu_loss)}, 1e-4);
    expect_close(at + " grad norm", {static_cast<float>(gnorm)}, {static_cast<float>(norm)}, 1e-4);
    const Batch e = make_batch(c, 3000 + static_cast<uint64_t>(s));  // an evaluation: rows synced, none moved
    EXPECT_TRUE(std::isfinite(dev->eval_loss(e.ids.data(), e.targets.data(), e.B, e.T))) << at;
  }
  ASSERT_EQ(gstate.step, state.step);
  jtok::sync_tables(m, state);
  jtok::Model g = test_model(c);  // the same layout, overwritten by the download
  const jtok::cuda::HostAdamWView gview = jtok::host_adamw_view(gstate);
  dev->download(g, &gview);
  const std::string name = "trainer " + mode + " 8 steps";
  const std::vector<float> params(g.params.begin(), g.params.end());
  expect_tensors_close(name + " param", m, params, m.params.data(), 1e-4);
  expect_tensors_close(name + " adam m", m, gstate.m, state.m.data(), 1e-4);
  expect_tensors_close(name + " adam v", m, gstate.v, state.v.data(), 1e-4);
  for (size_t k = 0; k < m.tables.size(); ++k) {
    expect_close(name + " table " + m.table_names[k], g.tables[k].to_vector(), m.tables[k].to_vector(), 1e-4);
    expect_close(name + " table m " + m.table_names[k], gstate.tables.m[k], state.tables.m[k], 1e-4);
    expect_close(name + " table v " + m.table_names[k], gstate.tables.v[k], state.tables.v[k], 1e-4);
  }
}

// What `train --device cuda` checks against the device's memory before it starts
// (device_memory_plan) against what a bf16 trainer holds at its peak through a step: never more,
// and at least 3/4 of it (the plan's activations are the CPU's; the workspace of gemm_lt's thread
// may be made by an earlier case, so up to 32 MiB of the plan may be held before this one).
TEST(CudaTrainer, DeviceMemoryWithinItsPlan) {
  jtok::Config cfg;
  cfg.model = tiny_jtokm();
  cfg.model.vocab_size = 4000;
  cfg.train = ten_steps();
  cfg.train.precision = "bf16";
  Batch b;
  b.B = 4, b.T = 64;
  b.ids = skewed_ids(b.B * b.T, cfg.model.vocab_size, 7000);
  b.targets = skewed_ids(b.B * b.T, cfg.model.vocab_size, 7001);
  const jtok::MemoryPlan plan = jtok::device_memory_plan(cfg, b.B, b.T);
  jtok::Model m = test_model(cfg.model);
  jtok::AdamWState state = jtok::make_adamw_state(m);
  const int64_t before = jtok::cuda::device_bytes_now();
  jtok::cuda::reset_device_bytes_peak();
  {
    const auto dev = jtok::cuda::make_device_trainer(m, jtok::host_adamw_view(state), true);
    dev->zero_grads();
    dev->forward_backward(b.ids.data(), b.targets.data(), b.B, b.T, 1.0f, false);
    jtok::device_optimizer_step(*dev, state, cfg.train);
  }
  const int64_t held = jtok::cuda::device_bytes_peak() - before;
  std::printf("device memory: peak %.1f MiB held, the plan %.1f MiB\n", static_cast<double>(held) / (1 << 20),
              static_cast<double>(plan.steady()) / (1 << 20));
  EXPECT_LE(held, plan.steady());
  const int64_t workspace = static_cast<int64_t>(jtok::cuda::Matmul::kWorkspaceBytes);
  EXPECT_GE(held, (plan.steady() - workspace) * 3 / 4);
  // Every array freed with the trainer; gemm_lt's workspace stays with its thread.
  const int64_t left = jtok::cuda::device_bytes_now() - before;
  EXPECT_TRUE(left == 0 || left == workspace) << left;
}

// JTOK_PROFILE=1's phase times (cuda/phase_profile.h): every phase of a JTok-M step named, in step
// order, none negative, two steps counted; and a profiled step's loss and norm are the unprofiled
// one's, bit for bit (the marks are events: they order nothing new on the one stream).
TEST(CudaTrainer, ProfileTimesEveryPhaseAndChangesNoBits) {
  const jtok::ModelConfig c = tiny_jtokm();
  const jtok::TrainConfig t = ten_steps();
  std::vector<double> losses[2], norms[2];
  std::vector<std::pair<std::string, double>> phases;
  for (int profiled = 0; profiled < 2; ++profiled) {
    jtok::Model m = test_model(c);
    jtok::AdamWState state = jtok::make_adamw_state(m);
    const auto dev = jtok::cuda::make_device_trainer(m, jtok::host_adamw_view(state), true);
    dev->set_profiling(profiled == 1);
    for (uint64_t s = 0; s < 2; ++s) {
      const Batch b = make_batch(c, 8000 + s);
      dev->zero_grads();
      losses[profiled].push_back(dev->forward_backward(b.ids.data(), b.targets.data(), b.B, b.T, 1.0f, false).loss);
      norms[profiled].push_back(jtok::device_optimizer_step(*dev, state, t).grad_norm);
    }
    if (profiled) phases = dev->profile_ms();
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(norms[0], norms[1]);
  // JTok-M's "table row sync" follows each layer's routing, inside its attention half.
  const std::vector<std::string> want = {"embedding",
                                         "attention",
                                         "table row sync",
                                         "mlp + tables",
                                         "final norm",
                                         "lm head + loss",
                                         "mlp + tables backward",
                                         "attention backward",
                                         "embedding backward",
                                         "gradient norm",
                                         "adamw",
                                         "table adamw"};
  ASSERT_EQ(phases.size(), want.size());
  double sum = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(phases[i].first, want[i]);
    EXPECT_GE(phases[i].second, 0.0) << want[i];
    sum += phases[i].second;
  }
  EXPECT_GT(sum, 0.0);
}

TEST(CudaTrainer, ResumedStateStepsMatchCpu) {
  for (const char* mode : {"dense", "sparse", "dense-eager"}) expect_trainer_matches_cpu(mode);
}

// Fault injection's NaN gradient (JTOK_TEST_NAN_GRAD_AT_STEP) with --train-only tables: the trainer
// puts it where the norm sees it (not into a frozen tensor, whose gradient the step zeroes), so the
// step is refused as the CPU's is; the next one applies.
TEST(CudaTrainer, PoisonedGradientRefusedWithAFrozenBackbone) {
  const jtok::ModelConfig c = tiny_jtok_jtokm();
  const jtok::TrainConfig t = ten_steps();
  jtok::Model m = test_model(c);
  m.backbone_frozen = true;
  jtok::AdamWState state = jtok::make_adamw_state(m);
  const auto dev = jtok::cuda::make_device_trainer(m, jtok::host_adamw_view(state), false);
  const Batch b = make_batch(c, 6000);
  dev->zero_grads();
  dev->forward_backward(b.ids.data(), b.targets.data(), b.B, b.T, 1.0f, false);
  dev->poison_gradient();
  EXPECT_THROW(jtok::device_optimizer_step(*dev, state, t), jtok::Error);
  EXPECT_EQ(state.step, 0);
  dev->zero_grads();
  dev->forward_backward(b.ids.data(), b.targets.data(), b.B, b.T, 1.0f, false);
  EXPECT_TRUE(std::isfinite(jtok::device_optimizer_step(*dev, state, t).grad_norm));
  EXPECT_EQ(state.step, 1);
}

// Elements of a bf16 copy (n) that are not the round-to-nearest bf16 of their fp32 master.
int64_t stale_copies(const float* master_dev, const __nv_bfloat16* copy_dev, int64_t n, cudaStream_t s) {
  std::vector<float> master(static_cast<size_t>(n));
  std::vector<__nv_bfloat16> copy(static_cast<size_t>(n));
  jtok::cuda::copy_to_host(master.data(), master_dev, n, s);
  jtok::cuda::copy_to_host(copy.data(), copy_dev, n, s);
  int64_t bad = 0;
  for (size_t i = 0; i < master.size(); ++i) {
    const __nv_bfloat16 want = __float2bfloat16_rn(master[i]);
    bad += std::memcmp(&want, &copy[i], sizeof want) != 0 ? 1 : 0;
  }
  return bad;
}

void expect_copies_follow_masters(const jtok::cuda::DeviceModel<__nv_bfloat16>& dm, const std::string& at) {
  EXPECT_EQ(stale_copies(dm.master.get(), dm.copy.get(), dm.n_params, dm.stream), 0) << at << ": flat weights";
  EXPECT_EQ(stale_copies(dm.tables.get(), dm.table_copy.get(), dm.tables.size(), dm.stream), 0) << at << ": tables";
}

// 4 bf16 steps, each followed by an evaluation forward (its row syncs replay deferred rows).
void expect_bf16_copies_follow(const std::string& mode, bool frozen) {
  const jtok::ModelConfig c = tiny_jtok_jtokm();
  jtok::TrainConfig t = ten_steps();
  t.table_learning_rate = 1e-2;
  jtok::Model m = test_model(c);
  m.backbone_frozen = frozen;
  jtok::cuda::DeviceModel<__nv_bfloat16> dm(m);
  jtok::cuda::DeviceActs<__nv_bfloat16> da;
  jtok::cuda::DeviceAdamW opt(dm, mode != "sparse");
  da.row_sync = jtok::cuda::table_row_sync(dm, opt);
  da.embed_sync = jtok::cuda::embedding_row_sync(dm, opt);
  const std::string name = "bf16 " + mode + (frozen ? " frozen backbone" : "");
  for (int64_t s = 0; s < 4; ++s) {
    const Batch b = make_batch(c, 4000 + static_cast<uint64_t>(s)), e = make_batch(c, 5000 + static_cast<uint64_t>(s));
    jtok::cuda::zero_grads(dm);
    jtok::cuda::forward(dm, da, b.ids.data(), b.B, b.T);
    jtok::cuda::backward(dm, da, b.targets.data());
    jtok::cuda::optimizer_step(dm, opt, step_consts(t, s), static_cast<float>(t.max_grad_norm));
    if (mode == "dense-eager") jtok::cuda::sync_tables(dm, opt);
    expect_copies_follow_masters(dm, name + " after step " + std::to_string(s + 1));
    jtok::cuda::forward(dm, da, e.ids.data(), e.B, e.T);
    jtok::cuda::forward_loss(dm, da, e.targets.data());
    expect_copies_follow_masters(dm, name + " after an evaluation at step " + std::to_string(s + 1));
  }
  jtok::cuda::sync_tables(dm, opt);
  expect_copies_follow_masters(dm, name + " after sync_tables");
}

TEST(CudaTrainer, Bf16CopiesFollowTheirMasters) {
  for (const char* mode : {"dense", "sparse", "dense-eager"}) expect_bf16_copies_follow(mode, false);
  expect_bf16_copies_follow("dense", true);
}

}  // namespace
