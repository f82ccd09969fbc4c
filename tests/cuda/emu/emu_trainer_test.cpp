// How often a training step waits for the device (the emulation's count of the host's waits,
// emu_runtime.h's host_waits): each wait is a round trip in which the GPU runs dry until the host
// queues more. A micro-batch of a MoE + JTok + JTok-M model with the hidden-state telemetry waits
// once, for its loss: the MoE and JTok-M aux losses, the routing counts and the layers' output sums
// are copied right after the forward and read after that wait (cuda/model.h's queue_forward_stats).
// The optimizer step: once, for the norm and the table counters, and once at its end.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/training.h"
#include "emu_runtime.h"
#include "model_case.h"
#include "step_case.h"
#include "train/optimizer.h"
#include "train/tables_cuda.h"

namespace {

using namespace jtok::cuda_test;

TEST(EmulatedTrainer, AMicroBatchWaitsOnceForItsLoss) {
  const jtok::ModelConfig c = tiny_moe_jtok_jtokm();
  jtok::Model m = test_model(c);
  jtok::AdamWState state = jtok::make_adamw_state(m);
  const auto dev = jtok::cuda::make_device_trainer(m, jtok::host_adamw_view(state), false, {true, false, true, false});
  const jtok::TrainConfig t = ten_steps();
  uint64_t waits[2] = {};
  for (int step = 0; step < 2; ++step) {  // the first sizes the activations (its allocations wait too)
    const Batch b = make_batch(c, 700 + static_cast<uint64_t>(step));
    const uint64_t at_start = emu::host_waits();
    dev->zero_grads();
    const jtok::cuda::MicroBatchLoss r = dev->forward_backward(b.ids.data(), b.targets.data(), b.B, b.T, 1.0f, true);
    const uint64_t after_micro_batch = emu::host_waits();
    jtok::device_optimizer_step(*dev, state, t);
    waits[0] = after_micro_batch - at_start, waits[1] = emu::host_waits() - after_micro_batch;
    EXPECT_GT(r.moe_aux, 0.0);
    EXPECT_GT(r.jtokm_aux, 0.0);
    EXPECT_GT(r.hidden_std, 0.0);
    EXPECT_EQ(r.jtokm_load.size(), 2u);  // a JTok-M layer's each
  }
  EXPECT_EQ(waits[0], 1u) << "a micro-batch's waits";
  EXPECT_EQ(waits[1], 2u) << "an optimizer step's waits";
}

}  // namespace
