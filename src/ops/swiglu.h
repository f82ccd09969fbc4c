// SwiGLU activation: out = silu(gate) * up, silu(x) = x * sigmoid(x). All (N,F).
#pragma once
#include <cstdint>

namespace jtok {

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
// dgate, dup are overwritten (not accumulated).
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);

void swiglu_forward_ref(float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward_ref(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);

}  // namespace jtok
