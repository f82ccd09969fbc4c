// The memory a training run holds, by part, from its config alone (`jtok flops`, and `jtok train`
// at start-up, which refuses a plan larger than the machine's available memory). All fp32:
//   weights      the flat parameters (backbone, JTok scalers, JTok-M routers)
//   tables       the token-indexed tables (JTok: one Vp x d per layer; JTok-M: n_e per layer)
//   moments      AdamW's m and v: of the trainable flat parameters (none for a frozen backbone,
//                train_only "tables") and of the tables (dense, every row)
//   gradients    the flat gradient buffer (every flat parameter, frozen ones included) and the
//                tables' row-sparse gradients (an upper bound: every id of a step distinct)
//   activations  one micro-batch's (model/activation_bytes.h, every id distinct)
//   checkpoint   what writing a checkpoint adds at its peak: save_checkpoint holds a copy of the
//                weights and tables while it builds the optimizer file in memory (a copy of the
//                moments) and serializes it (another): weights + tables + 2 x moments
// With embedding parallelism over P ranks each rank holds 1/P of the tables and their moments.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "train/config.h"

namespace jtok {

struct MemoryPlan {
  int64_t weights = 0, tables = 0, moments_backbone = 0, moments_tables = 0, gradients = 0, activations = 0;
  int64_t workspaces = 0;  // the GPU's cuBLASLt workspaces (0 on the CPU)
  int64_t checkpoint = 0;
  int64_t steady() const {
    return weights + tables + moments_backbone + moments_tables + gradients + activations + workspaces;
  }
  int64_t total() const { return steady() + checkpoint; }
};

// B, T: the micro-batch; table_ranks: ranks the tables are sharded over (1 = not sharded).
MemoryPlan memory_plan(const Config& cfg, int64_t B, int64_t T, int64_t table_ranks = 1);
// `train --device cuda`'s plan of GPU memory (the parts as above): the fp32 masters plus, in bf16
// (`precision`), the forward's copies of the weights and tables; the tables' gradients dense
// (table-shaped, fp32) with a flag and a step count a row; the moments of every table row; the
// activations as the CPU's (an upper bound in bf16); cuBLASLt's two 32 MiB workspaces (the model's
// products and the LM head's, cuda/matmul.cu); no checkpoint copies (those are the host's).
MemoryPlan device_memory_plan(const Config& cfg, int64_t B, int64_t T);
// The host's part of a --device cuda run: the plan without activations (they live on the GPU).
MemoryPlan host_plan_of_device_run(const Config& cfg, int64_t B, int64_t T);
nlohmann::json to_json(const MemoryPlan& p);
// The plan, one line per part, each line starting with indent.
std::string memory_plan_text(const MemoryPlan& p, const std::string& indent);
// MemAvailable of /proc/meminfo in bytes, or -1 where it cannot be read.
int64_t mem_available_bytes();
// "" if the plan fits in `available` bytes, else a message naming the parts to shrink.
std::string memory_plan_refusal(const MemoryPlan& p, const Config& cfg, int64_t available);

}  // namespace jtok
