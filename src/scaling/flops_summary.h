// `jtok flops`'s report: a config's parameter counts and training FLOPs per token (scaling/flops.h),
// and the memory a training run holds (state, one micro-batch's activations by component, and the
// memory plan `jtok train` checks), as text or as one JSON object.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/activation_bytes.h"
#include "train/config.h"
#include "scaling/flops.h"
#include "scaling/memory_plan.h"

namespace jtok {

struct FlopsSummary {
  int64_t seq_len = 0, micro_batch = 0;  // T and B the figures are for
  FlopsReport flops;
  ActivationBytes activations;
  int64_t state_fp32 = 0;  // weights, gradients, two AdamW moments in fp32 (dense: an upper bound)
  MemoryPlan plan;         // what train holds (train_only, sparse table grads)
  MemoryPlan gpu_plan;     // what `train --device cuda` holds on the GPU (device_memory_plan)
};

// seq_len, micro_batch: 0 takes the config's seq_len and micro_batch_size.
FlopsSummary flops_summary(const Config& cfg, int64_t seq_len, int64_t micro_batch);
nlohmann::json to_json(const FlopsSummary& s);
// The text report (parameters, training FLOPs per token, training memory, memory plan).
std::string flops_summary_text(const FlopsSummary& s, const Config& cfg);

}  // namespace jtok
