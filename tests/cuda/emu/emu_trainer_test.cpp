// How often a training step waits for the device (the emulation's count of the host's waits,
// emu_runtime.h's host_waits): each wait is a round trip in which the GPU runs dry until the host
// queues more. A micro-batch of a MoE + JTok + JTok-M model with the hidden-state telemetry waits
// once, for its loss: the MoE and JTok-M aux losses, the routing counts and the layers' output sums
// are copied right after the forward and read after that wait (cuda/model.h's queue_forward_stats).
// The optimizer step: once, for the norm and the table counters, and once at its end.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>

#include "cuda/training.h"
#include "emu_runtime.h"
#include "model_case.h"
#include "step_case.h"
#include "train/optimizer.h"
#include "train/tables_cuda.h"

namespace {

using namespace jtok::cuda_test;

// The host's waits of a micro-batch and of the optimizer step after it, at the second step (the
// first sizes the activations: its allocations wait too).
std::pair<uint64_t, uint64_t> step_waits(const jtok::cuda::DeviceTableOptions& o) {
  const jtok::ModelConfig c = tiny_moe_jtok_jtokm();
  jtok::Model m = test_model(c);
  jtok::AdamWState state = jtok::make_adamw_state(m);
  const auto dev = jtok::cuda::make_device_trainer(m, jtok::host_adamw_view(state), false, o);
  jtok::TrainConfig t = ten_steps();
  t.table_optimizer = o.dense ? (o.eager ? "dense-eager" : "dense") : "sparse";
  std::pair<uint64_t, uint64_t> waits;
  for (int step = 0; step < 2; ++step) {
    const Batch b = make_batch(c, 700 + static_cast<uint64_t>(step));
    const uint64_t at_start = emu::host_waits();
    dev->zero_grads();
    const jtok::cuda::MicroBatchLoss r = dev->forward_backward(b.ids.data(), b.targets.data(), b.B, b.T, 1.0f, true);
    const uint64_t after_micro_batch = emu::host_waits();
    jtok::device_optimizer_step(*dev, state, t);
    waits = {after_micro_batch - at_start, emu::host_waits() - after_micro_batch};
    EXPECT_GT(r.moe_aux, 0.0);
    EXPECT_GT(r.jtokm_aux, 0.0);
    EXPECT_GT(r.hidden_std, 0.0);
    EXPECT_EQ(r.jtokm_load.size(), 2u);  // a JTok-M layer's each
  }
  return waits;
}

// (Without dedup the tables' gradients are summed by atomics, in no fixed order: its bits would
// differ between the CI set's two thread orders; its waits are the deduplicated path's.)
TEST(EmulatedTrainer, AMicroBatchWaitsOnceForItsLoss) {
  // {dense tables, eager (dense-eager), dedup, side streams}
  for (const jtok::cuda::DeviceTableOptions& o : {jtok::cuda::DeviceTableOptions{true, false, true, false},
                                                  jtok::cuda::DeviceTableOptions{false, false, true, false},
                                                  jtok::cuda::DeviceTableOptions{true, true, true, false},
                                                  jtok::cuda::DeviceTableOptions{true, false, true, true}}) {
    const auto [micro_batch, optimizer] = step_waits(o);
    const std::string at =
        std::string(o.dense ? "dense" : "sparse") + (o.eager ? "-eager" : "") + (o.streams ? ", side streams" : "");
    EXPECT_EQ(micro_batch, 1u) << at << ": a micro-batch's waits";
    EXPECT_EQ(optimizer, 2u) << at << ": an optimizer step's waits";
  }
}

}  // namespace
