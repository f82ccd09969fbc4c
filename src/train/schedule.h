// Learning-rate schedules of docs/model.md: linear warmup, then cosine, WSD or constant.
#pragma once
#include <cstdint>
#include "train/config.h"

namespace jtok {

// lr of the optimizer step with 0-based index `step`.
double lr_at(const TrainConfig& t, int64_t step);

}  // namespace jtok
