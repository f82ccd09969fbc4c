// The GPU placement (`train --device cuda`): the whole model, its tables and its optimizer state on
// one GPU (cuda/training.h's DeviceTrainer, which the placement owns and the step reaches through
// TablePlacement::device()). The host's model and AdamW state are the checkpoint form: read once at
// the start (fresh, --init-from or resumed), written back before a checkpoint (then saved as the CPU
// engine saves them) or a sample.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>

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

// What the device trainer timed and chose for its bf16 attention (cuda/attention_rows.h), as log.jsonl's
// attention_rows record and bench-train's attention_rows field hold it: {"forward", "backward",
// "forward_ms": [16 rows, 32 rows], "backward_ms"} (ms 0 where none ran: hd 128).
nlohmann::json attention_rows_json(const cuda::AttentionRows& r);

}  // namespace jtok
