// `--device loopback` (tests): the GPU trainer's path (train/tables_cuda.h) with the CPU engine as
// its device. It keeps a model and an AdamW state of its own, filled from the host's through the
// same HostAdamWView and written back the same way as the GPU's, so the trainer's device plumbing
// (placement, steps, checkpoints, resume, validation, samples, fault injection) runs on every
// machine and in CI, and a run matches `--device cpu` bit for bit (tests/test_train_device.sh).
#pragma once
#include <memory>

#include "cuda/training.h"
#include "train/config.h"

namespace jtok {

std::unique_ptr<cuda::DeviceTrainer> make_loopback_trainer(const Model& host, const cuda::HostAdamWView& adam,
                                                           const TrainConfig& t);

}  // namespace jtok
