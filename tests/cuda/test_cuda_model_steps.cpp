// 10 optimizer steps of the whole model on the GPU (src/cuda/model_optimizer.h) against
// train/optimizer.cpp's optimizer_step on the same weights and batches, clipping on: the Qwen3-style
// model; JTok + JTok-M with the tables' deferred AdamW "dense" and "sparse", also with two
// micro-batches a step and after a refused (non-finite) step; a frozen backbone; MoE alone and beside
// JTok + JTok-M. Each step's loss and gradient norm within 1e-4, the weights and tables after them
// within 1e-4 (Adam divides by sqrt(v): a gradient near 0 turns a small difference into a larger
// step; the tables 3e-4 with two micro-batches, below). And the token embedding stepped by its rows
// against the flat AdamW, bit for bit. Runs only on a GPU host (in test_cuda_ops; bash scripts/test_cuda.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "cuda/model.h"
#include "cuda/model_optimizer.h"
#include "model/transformer.h"
#include "model_case.h"
#include "ops/adamw.h"
#include "step_case.h"
#include "train/config.h"
#include "train/optimizer.h"
#include "train/schedule.h"

namespace {

using namespace jtok::cuda_test;

// How the steps run: micro-batches a step (each its own batch, grad_scale 1/micro: the trainer's
// accumulation), and a refused step: a NaN written into a touched gradient row of table 0 on both
// devices after the backward, both optimizers refuse the step (nothing moves), the next step starts
// from zero_grads (the GPU: the flagged rows cleared, no whole-table memset) and its table gradients
// must equal the CPU's, which zeroes everything: no row of the refused step leaks into them.
struct StepPlan {
  int micro = 1;
  int64_t refuse_at = -1;  // the loop step (0-based) that is poisoned and refused; -1: none
  bool frozen_backbone = false;  // --train-only tables
  double table_tol = 1e-4;       // the tables after the steps
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
  da.embed_sync = jtok::cuda::embedding_row_sync(dm, opt);
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
  // The same catch-up work: the rows each forward read (JTok-M's chosen (id, table) pairs alone), each
  // step's touched rows and the final sync, replayed on both devices alike; the same rows stepped.
  const jtok::TableMoments& tm = state.tables;
  using Counts = std::array<unsigned long long, 4>;
  EXPECT_EQ(opt.counts, (Counts{static_cast<unsigned long long>(tm.replayed_rows),
                                static_cast<unsigned long long>(tm.replayed_warm_rows),
                                static_cast<unsigned long long>(tm.replayed_warm_steps),
                                static_cast<unsigned long long>(tm.stepped_rows)}))
      << name << ": rows replayed, of them warm, their steps; rows stepped (GPU, then CPU)";
  if (t.table_optimizer == "dense" && !m.tables.empty()) {
    EXPECT_GT(tm.replayed_warm_rows, 0) << name << ": the test means warm rows to catch up";
  }
  if (!m.tables.empty()) {
    EXPECT_GT(tm.stepped_rows, 0) << name;
  }
  expect_tensors_close(name + " 10 steps param", m, jtok::cuda::download_params(dm), m.params.data(), 1e-4);
  for (size_t k = 0; k < m.tables.size(); ++k)
    expect_close(name + " 10 steps table " + m.table_names[k], jtok::cuda::download_table(dm, static_cast<int64_t>(k)),
                 m.tables[k].to_vector(), plan.table_tol);
}

// --train-only tables: only the tables, scalers and routers move; the backbone's weights stay put
// on both devices. Neither makes a frozen tensor's weight gradient (its gradient pointer is null):
// one made on the GPU would enter its norm, and the norms are compared every step. Dense, MoE with
// a shared expert (the experts' and routers' gradients skipped), and Qwen3's shape (qk_norm gains,
// tied embeddings).
TEST(CudaModel, TenAdamWStepsFrozenBackboneMatchCpu) {
  jtok::TrainConfig t = ten_steps();
  t.table_learning_rate = 1e-2;
  t.max_grad_norm = 1e-3;  // the tables' and scalers' gradients alone: still clipped
  const StepPlan frozen{1, -1, true};
  expect_ten_steps_match("adamw frozen backbone jtok+jtokm", tiny_jtok_jtokm(), t, frozen);
  expect_ten_steps_match("adamw frozen backbone moe+jtok+jtokm", tiny_moe_jtok_jtokm(), t, frozen);
  jtok::ModelConfig qwen3 = tiny_qwen3();
  qwen3.jtokm = true, qwen3.jtokm_n_e = 3, qwen3.jtokm_top_k = 2, qwen3.jtokm_aux_loss_coef = 1e-2;
  expect_ten_steps_match("adamw frozen backbone qwen3+jtokm", qwen3, t, frozen);
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
  // Each batch's hot id (make_batch: 33 of 66 positions) in both micro-batches: its rows' gradients
  // are sums of 66 terms, two micro-batches' worth, and Adam's division by sqrt(v) makes the CPU's and
  // the GPU's fp32 rounding of them (cuBLASLt's products upstream, the hot id's pieces) ~1.3e-4 in two
  // tables after 10 steps (1.35e-4 with the kernels before the pieces): 3e-4 here.
  expect_table_steps_match("adamw 2 micro-batches", StepPlan{2, -1, false, 3e-4});
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

// A run of the device model whose optimizer steps the token embedding by its rows (defer) or as a
// segment of the flat AdamW.
template <typename E>
struct EmbeddingRun {
  jtok::cuda::DeviceModel<E> dm;
  jtok::cuda::DeviceActs<E> da;
  jtok::cuda::DeviceAdamW opt;
  EmbeddingRun(const jtok::Model& m, bool defer) : dm(m), opt(dm, true, defer) {
    da.row_sync = jtok::cuda::table_row_sync(dm, opt);
    da.embed_sync = jtok::cuda::embedding_row_sync(dm, opt);
  }
  // A step of two micro-batches: the mean loss and the norm.
  std::pair<double, double> step(const Batch& b0, const Batch& b1, const jtok::cuda::StepConsts& k, float clip) {
    jtok::cuda::zero_grads(dm);
    double loss = 0;
    for (const Batch* b : {&b0, &b1}) {
      jtok::cuda::forward(dm, da, b->ids.data(), b->B, b->T);
      loss += 0.5 * jtok::cuda::backward(dm, da, b->targets.data(), 0.5f);
    }
    return {loss, jtok::cuda::optimizer_step(dm, opt, k, clip)};
  }
};

// The first element where two device arrays' bits differ, or -1.
template <typename T>
int64_t first_difference(const T* a, const T* b, int64_t n, cudaStream_t s) {
  std::vector<T> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  jtok::cuda::copy_to_host(x.data(), a, n, s);
  jtok::cuda::copy_to_host(y.data(), b, n, s);
  for (int64_t i = 0; i < n; ++i)
    if (std::memcmp(&x[static_cast<size_t>(i)], &y[static_cast<size_t>(i)], sizeof(T)) != 0) return i;
  return -1;
}

// The token embedding stepped by its rows (DeviceAdamW::defer_embedding: a row replayed when a forward
// reads it, stepped when it has a gradient, all of them by sync_tables) against the flat AdamW over
// the whole (Vp, d) tensor: every step's loss and norm, then the weights, the bf16 copy and the
// moments, bit for bit; some rows replayed, none asked outside the kept steps.
template <typename E>
void expect_embedding_rows_give_flat_bits(const std::string& name, const jtok::ModelConfig& c) {
  const jtok::TrainConfig t = ten_steps();
  const jtok::Model m = test_model(c);
  EmbeddingRun<E> rows(m, true), flat(m, false);
  ASSERT_TRUE(rows.opt.defer_embedding && !flat.opt.defer_embedding) << name;
  for (int64_t s = 0; s < 4; ++s) {
    const Batch b0 = make_batch(c, 2000 + 2 * static_cast<uint64_t>(s)),
                b1 = make_batch(c, 2001 + 2 * static_cast<uint64_t>(s));
    const jtok::cuda::StepConsts k = step_consts(t, s);
    const auto got = rows.step(b0, b1, k, static_cast<float>(t.max_grad_norm));
    const auto want = flat.step(b0, b1, k, static_cast<float>(t.max_grad_norm));
    EXPECT_EQ(got.first, want.first) << name << " step " << s + 1 << " loss";
    EXPECT_EQ(got.second, want.second) << name << " step " << s + 1 << " norm";
  }
  jtok::cuda::sync_tables(rows.dm, rows.opt);
  jtok::cuda::sync_tables(flat.dm, flat.opt);
  const cudaStream_t st = rows.dm.stream;
  const int64_t n = rows.dm.n_params;
  EXPECT_EQ(first_difference(rows.dm.master.get(), flat.dm.master.get(), n, st), -1) << name << ": weights";
  EXPECT_EQ(first_difference(rows.opt.m.get(), flat.opt.m.get(), n, st), -1) << name << ": first moments";
  EXPECT_EQ(first_difference(rows.opt.v.get(), flat.opt.v.get(), n, st), -1) << name << ": second moments";
  if constexpr (!std::is_same_v<E, float>) {
    EXPECT_EQ(first_difference(rows.dm.copy.get(), flat.dm.copy.get(), n, st), -1) << name << ": bf16 copy";
  }
  std::array<unsigned long long, jtok::cuda::kTableStats> stats{};
  jtok::cuda::copy_to_host(stats.data(), rows.opt.embed_stats(), jtok::cuda::kTableStats, st);
  EXPECT_GT(stats[2], 0u) << name << ": warm rows' replayed steps (rows not in every batch)";
  EXPECT_GT(stats[3], 0u) << name << ": rows stepped with a gradient";
  EXPECT_EQ(stats[4], 0u) << name << ": rows asked outside the kept steps";
}

TEST(CudaModel, EmbeddingRowsGiveTheFlatBits) {
  expect_embedding_rows_give_flat_bits<float>("fp32 dense", tiny_dense());
  expect_embedding_rows_give_flat_bits<__nv_bfloat16>("bf16 dense", tiny_dense());
  expect_embedding_rows_give_flat_bits<float>("fp32 jtok+jtokm", tiny_jtok_jtokm());
  jtok::ModelConfig tied = tiny_dense();
  tied.tie_word_embeddings = true;  // every row has the LM head's gradient: nothing to defer
  EXPECT_FALSE(jtok::cuda::DeviceAdamW(jtok::cuda::DeviceModel<float>(test_model(tied)), true, true).defer_embedding);
}

}  // namespace
