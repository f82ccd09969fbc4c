#include "train/schedule.h"

#include <algorithm>
#include <cmath>

namespace jtok {

double lr_at(const TrainConfig& t, int64_t step) {
  const int64_t W = t.resolved_warmup_steps();
  if (step < W) return t.learning_rate * static_cast<double>(step + 1) / static_cast<double>(W);
  if (t.lr_scheduler_type == "cosine") {
    double x = std::min(1.0, static_cast<double>(step - W) / static_cast<double>(std::max<int64_t>(1, t.max_steps - W)));
    return t.min_lr + 0.5 * (t.learning_rate - t.min_lr) * (1.0 + std::cos(M_PI * x));
  }
  if (t.lr_scheduler_type == "wsd") {
    const int64_t D = static_cast<int64_t>(std::llround(t.decay_ratio * static_cast<double>(t.max_steps)));
    const int64_t S = t.max_steps - D;
    if (step < S || D == 0) return t.learning_rate;
    double x = std::min(1.0, static_cast<double>(step - S + 1) / static_cast<double>(D));
    return t.learning_rate + (t.min_lr - t.learning_rate) * x;
  }
  return t.learning_rate;  // constant
}

}  // namespace jtok
