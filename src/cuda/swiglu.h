// SwiGLU on the GPU, src/ops/swiglu.h's contract: out = silu(gate) * up, silu(g) = g * sigmoid(g);
// fp32 arithmetic, T = float (checking) or __nv_bfloat16 (storage). gate and up are rows of a
// wider buffer when ld > F (the MLP's fused gate|up matmul output: gate = buf, up = buf + F, ld 2F).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace jtok::cuda {

// gate, up (N, ld) of which the first F columns are read -> out (N,F).
template <typename T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t N, int64_t F, int64_t ld, cudaStream_t stream);

// dout (N,F), gate, up (N, ld) -> dgate, dup (N, ld), their first F columns overwritten (as the CPU op).
template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t N, int64_t F, int64_t ld,
                     cudaStream_t stream);

}  // namespace jtok::cuda
