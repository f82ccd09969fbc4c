// Training without dedup (DeviceActs::table_dedup false, `table_dedup: false`: JTok's and JTok-M's
// rows gathered and their gradients scattered a token position at a time, fp32 atomics into rows that
// repeat) against the deduplicated path, on a dense + JTok + JTok-M model over batches with repeated
// ids (skewed_ids), 10 fp32 steps of the deferred "dense" table AdamW:
// - step 1's loss is bitwise equal (the forward gathers the same rows by the same arithmetic);
// - every step's loss and gradient norm within 1e-5 relative (the only difference is the order of the
//   fp32 sums of a repeated row's gradient), every table's gradient within 1e-5 normalised error;
// - every step's touched rows are the same set, flag for flag, and after 10 steps every row's
//   optimizer step count is equal (the table AdamW stepped the same rows); the weights and tables
//   within 1e-4 (AdamW's normalised updates amplify the sums' rounding where a gradient is near 0).
// Through the trainer (make_device_trainer's table_dedup, dense-eager as bench/gpu_train_peer.sh's
// jtokm_naive): 5 steps' losses within 1e-5 of the deduplicated trainer's in fp32, 5e-3 in bf16.
// Runs only on a GPU host (in test_cuda_ops; bash scripts/test_cuda.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "cuda/model.h"
#include "cuda/model_optimizer.h"
#include "cuda/training.h"
#include "model_case.h"
#include "step_case.h"
#include "train/optimizer.h"
#include "train/tables_cuda.h"

namespace {

using namespace jtok::cuda_test;

struct DeviceRun {
  jtok::cuda::DeviceModel<float> dm;
  jtok::cuda::DeviceActs<float> acts;
  jtok::cuda::DeviceAdamW opt;
  DeviceRun(const jtok::Model& m, bool dedup) : dm(m), opt(dm, true) {
    acts.row_sync = jtok::cuda::table_row_sync(dm, opt);
    acts.embed_sync = jtok::cuda::embedding_row_sync(dm, opt);
    acts.table_dedup = dedup;
    opt.zero_table_grad_rows = !dedup;
  }
  double forward_backward(const Batch& b) {
    jtok::cuda::zero_grads(dm);
    jtok::cuda::forward(dm, acts, b.ids.data(), b.B, b.T);
    return jtok::cuda::backward(dm, acts, b.targets.data());
  }
};

void expect_relative(const std::string& what, double got, double want, double tol) {
  EXPECT_LE(std::abs(got - want), tol * std::abs(want)) << what << ": " << got << " vs " << want;
}

// Every table's touched flags equal (and some set: the tables trained), their gradients close.
void expect_same_touched(const std::string& at, const DeviceRun& naive, const DeviceRun& dedup) {
  int64_t touched = 0;
  for (int64_t k = 0; k < dedup.dm.n_tables; ++k) {
    const std::vector<uint8_t> a = jtok::cuda::download_table_touched(naive.dm, k);
    const std::vector<uint8_t> b = jtok::cuda::download_table_touched(dedup.dm, k);
    int64_t differ = 0;
    for (size_t r = 0; r < b.size(); ++r) touched += b[r] != 0, differ += (a[r] != 0) != (b[r] != 0);
    EXPECT_EQ(differ, 0) << at << " table " << k << ": touched rows differ";
    expect_close(at + " table grad " + std::to_string(k), jtok::cuda::download_table_grad(naive.dm, k),
                 jtok::cuda::download_table_grad(dedup.dm, k), 1e-5);
  }
  EXPECT_GT(touched, 0) << at;
}

TEST(CudaTableDedup, PerPositionRowsStepAsTheDeduplicatedOnes) {
  const jtok::ModelConfig c = tiny_jtok_jtokm();
  jtok::TrainConfig t = ten_steps();
  t.table_learning_rate = 1e-2;
  const jtok::Model m = test_model(c);
  DeviceRun naive(m, false), dedup(m, true);
  ASSERT_GT(naive.dm.n_tables, 1);
  for (int64_t s = 0; s < 10; ++s) {
    const Batch b = make_batch(c, 7000 + static_cast<uint64_t>(s));
    const std::set<int32_t> distinct(b.ids.begin(), b.ids.end());
    ASSERT_LT(distinct.size(), b.ids.size()) << "the batch must repeat ids (rows written by several blocks)";
    const std::string at = "no dedup step " + std::to_string(s + 1);
    const double loss = naive.forward_backward(b), want = dedup.forward_backward(b);
    if (s == 0) {
      EXPECT_EQ(loss, want) << at << ": the same forward";
    }
    expect_relative(at + " loss", loss, want, 1e-5);
    expect_same_touched(at, naive, dedup);
    const jtok::cuda::StepConsts k = step_consts(t, s);
    const double norm = jtok::cuda::optimizer_step(naive.dm, naive.opt, k, static_cast<float>(t.max_grad_norm));
    expect_relative(at + " grad norm", norm,
                    jtok::cuda::optimizer_step(dedup.dm, dedup.opt, k, static_cast<float>(t.max_grad_norm)), 1e-5);
  }
  jtok::cuda::sync_tables(naive.dm, naive.opt);
  jtok::cuda::sync_tables(dedup.dm, dedup.opt);
  std::vector<int32_t> steps_naive(static_cast<size_t>(naive.opt.row_step.size())), steps(steps_naive.size());
  jtok::cuda::copy_to_host(steps_naive.data(), naive.opt.row_step.get(), naive.opt.row_step.size(), naive.dm.stream);
  jtok::cuda::copy_to_host(steps.data(), dedup.opt.row_step.get(), dedup.opt.row_step.size(), dedup.dm.stream);
  EXPECT_EQ(steps_naive, steps) << "the table AdamW's row steps";
  expect_tensors_close("no dedup 10 steps param", m, jtok::cuda::download_params(naive.dm),
                       jtok::cuda::download_params(dedup.dm).data(), 1e-4);
  for (int64_t k = 0; k < naive.dm.n_tables; ++k)
    expect_close("no dedup 10 steps table " + std::to_string(k), jtok::cuda::download_table(naive.dm, k),
                 jtok::cuda::download_table(dedup.dm, k), 1e-4);
}

// 5 steps through make_device_trainer with and without dedup (dense-eager tables): the losses.
void expect_trainer_losses_agree(bool bf16, double tol) {
  const jtok::ModelConfig c = tiny_jtok_jtokm();
  jtok::TrainConfig t = ten_steps();
  t.table_learning_rate = 1e-2;
  const jtok::Model m = test_model(c);
  jtok::AdamWState state_a = jtok::make_adamw_state(m), state_b = jtok::make_adamw_state(m);
  const auto naive = jtok::cuda::make_device_trainer(m, jtok::host_adamw_view(state_a), bf16, {true, true, false});
  const auto dedup = jtok::cuda::make_device_trainer(m, jtok::host_adamw_view(state_b), bf16, {true, true, true});
  for (int64_t s = 0; s < 5; ++s) {
    const Batch b = make_batch(c, 8000 + static_cast<uint64_t>(s));
    const std::string at =
        std::string(bf16 ? "bf16" : "fp32") + " trainer without dedup, step " + std::to_string(s + 1);
    naive->zero_grads();
    dedup->zero_grads();
    const double loss = naive->forward_backward(b.ids.data(), b.targets.data(), b.B, b.T, 1.0f, false).loss;
    const double want = dedup->forward_backward(b.ids.data(), b.targets.data(), b.B, b.T, 1.0f, false).loss;
    expect_relative(at + " loss", loss, want, tol);
    EXPECT_TRUE(std::isfinite(jtok::device_optimizer_step(*naive, state_a, t).grad_norm)) << at;
    jtok::device_optimizer_step(*dedup, state_b, t);
  }
}

TEST(CudaTableDedup, TrainerWithoutDedupFollowsTheDeduplicatedTrainer) {
  expect_trainer_losses_agree(false, 1e-5);
  expect_trainer_losses_agree(true, 5e-3);
}

}  // namespace
