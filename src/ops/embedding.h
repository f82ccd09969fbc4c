// Dense token embedding lookup (the backbone's embed_tokens): out[n] = weight[ids[n]].
#pragma once
#include <cstdint>

namespace jtok {

// out (N,C); weight (V,C); ids (N) in [0, V).
void embedding_forward(float* out, const int32_t* ids, const float* weight, int64_t N, int64_t C);
// dweight (V,C) += scatter of dout (N,C) to rows ids.
void embedding_backward(float* dweight, const float* dout, const int32_t* ids, int64_t N, int64_t C);

void embedding_forward_ref(float* out, const int32_t* ids, const float* weight, int64_t N, int64_t C);
void embedding_backward_ref(float* dweight, const float* dout, const int32_t* ids, int64_t N, int64_t C);

}  // namespace jtok
