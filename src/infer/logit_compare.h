// A model's next-token distributions against a reference model's on the same positions (the
// quality of a low-precision export against its fp32 source, as llama.cpp's perplexity
// --kl-divergence does for its quantisations). Per position n, over the real vocabulary V:
//   p = softmax(logits[n]), q = softmax(ref_logits[n]) (in double)
//   KL(q || p) = sum_v q_v (log q_v - log p_v)      >= 0, 0 iff the distributions are equal
//   top-1 same: argmax p == argmax q (first index on ties)
//   d log p(target) = log p_target - log q_target
#pragma once
#include <cstdint>

namespace jtok {

struct LogitComparison {
  int64_t positions = 0, top1_same = 0;
  double kl_sum = 0, kl_max = 0;
  double dlogp_sum = 0, dlogp_abs_sum = 0, dlogp_abs_max = 0;
};

// logits, ref_logits: (N, ld) with the first V columns real; targets (N). Adds to acc.
void compare_logits(LogitComparison& acc, const float* logits, const float* ref_logits, const int32_t* targets,
                    int64_t N, int64_t V, int64_t ld);

}  // namespace jtok
