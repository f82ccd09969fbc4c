// The GPU placement (`train --device cuda`): the whole model, its tables and its optimizer state on
// one GPU (cuda/training.h's DeviceTrainer, which the placement owns and the step reaches through
// TablePlacement::device()). The host's model and AdamW state are the checkpoint form: read once at
// the start (fresh, --init-from or resumed), written back before a checkpoint (then saved as the CPU
// engine saves them) or a sample.
#pragma once
#include <memory>
#include <string>

#include "cuda/training.h"
#include "train/table_placement.h"

namespace jtok {

// Refuses, naming the flag, what the GPU trainer does not run: --tables disk, --embp, mpirun.
std::unique_ptr<TablePlacement> make_tables_on_gpu(const TableRunParts& p);

// The host AdamW state as the device trainer reads and writes it (pointers into a's arrays).
cuda::HostAdamWView host_adamw_view(AdamWState& a);

// optimizer_step (train/optimizer.h) on the device: the lr of state.step, the clip coefficient of the
// norm the device returns (the same fp32 formula), state.step advanced, the device's replay counts
// copied.
StepStats device_optimizer_step(cuda::DeviceTrainer& dev, AdamWState& state, const TrainConfig& t);

// The device's table counts (rows replayed, warm rows, their steps; rows stepped) into tables'
// statistics, where the device counts them (bench-train's rows_caught_up_per_step and
// rows_stepped_per_step read them).
void copy_replay_counts(const cuda::DeviceTrainer& dev, TableMoments& tables);

// "GPU attention: forward 32 query rows a warp (16: 0.812 ms, 32: 0.655 ms), backward 16 (...)": what
// the device trainer timed and chose (cuda/attention_rows.h); timings absent where none ran (hd 128).
std::string attention_rows_line(const cuda::AttentionRows& r);

}  // namespace jtok
