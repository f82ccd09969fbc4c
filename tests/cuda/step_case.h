// The step tests' shared parts (tests/cuda/test_cuda_model_steps.cpp, test_cuda_trainer.cpp): the
// device optimizer's step constants as the CPU's optimizer_step forms them, and the 10-step run's
// training configuration (warmup then cosine, clipping at a norm the gradients exceed).
#pragma once
#include <cstdint>

#include "cuda/model_optimizer.h"
#include "ops/adamw.h"
#include "train/config.h"
#include "train/schedule.h"

namespace jtok::cuda_test {

// The step's AdamW constants as the CPU's optimizer_step forms them (lr at the step before it; the
// token-indexed modules at their own lr).
inline jtok::cuda::AdamWConsts step_consts(const jtok::TrainConfig& t, double lr, int64_t step, bool decay) {
  const jtok::AdamWHyper h{static_cast<float>(lr), static_cast<float>(t.adam_beta1), static_cast<float>(t.adam_beta2),
                           static_cast<float>(t.adam_epsilon), decay ? static_cast<float>(t.weight_decay) : 0.0f,
                           step + 1, 1.0f};
  const jtok::AdamWStepConsts k = jtok::adamw_consts(h);
  return {k.b1, k.b2, k.eps, k.step_size, k.inv_sqrt_bc2, k.decay};
}
inline jtok::cuda::StepConsts step_consts(const jtok::TrainConfig& t, int64_t step) {
  const double lr = jtok::lr_at(t, step);
  const double table_lr = t.table_learning_rate < 0 ? lr : lr * (t.table_learning_rate / t.learning_rate);
  return {step_consts(t, lr, step, true), step_consts(t, lr, step, false), step_consts(t, table_lr, step, true),
          step_consts(t, table_lr, step, false)};
}

// lr 1e-3: a trajectory two implementations can follow for 10 steps. At 3e-3 the tiny Qwen3 is
// chaotic: the CPU engine itself, from weights moved by 1e-6 relative noise, ends step 9 with a
// gradient norm 6.5 % away (2e-6 at 1e-3), so no other summation order could meet 1e-4.
inline jtok::TrainConfig ten_steps() {
  jtok::TrainConfig t;
  t.max_steps = 10;
  t.warmup_steps = 3;
  t.learning_rate = 1e-3;
  t.max_grad_norm = 0.2;
  return t;
}

}  // namespace jtok::cuda_test
