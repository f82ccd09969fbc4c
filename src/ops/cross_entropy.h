// Softmax cross-entropy over a padded vocabulary: logits (N,Vp), only columns < V take part
// (padded columns act as -inf: they never win and get zero gradient).
#pragma once
#include <cstdint>

namespace jtok {

// Returns the summed loss over the N rows. If dlogits is non-null it receives
// grad_scale * (softmax - onehot) (padded columns 0); dlogits may alias logits (in place).
double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                     float grad_scale);

// Per-row losses (N): -log softmax(logits[n])[targets[n]] over the real vocabulary.
void cross_entropy_rows(float* out, const float* logits, const int32_t* targets, int64_t N, int64_t V, int64_t Vp);

double cross_entropy_ref(float* dlogits, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                         int64_t Vp, float grad_scale);

}  // namespace jtok
