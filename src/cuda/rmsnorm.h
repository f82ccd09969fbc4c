// RMSNorm on the GPU, src/ops/rmsnorm.h's contract: out = x / sqrt(mean(x^2) + eps) * weight over
// the last dimension C; fp32 arithmetic, T = float (checking) or __nv_bfloat16 (storage).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace jtok::cuda {

// Where the N rows of C elements lie: row r = (t, j), t = r / heads, j = r % heads, starts at
// t * stride + j * C. {}: packed (heads 1, stride C). qk_norm's heads inside the (N, qd + 2 kvd) rows
// of one q | k | v product: {H, qd + 2 kvd} from q's start, {KV, qd + 2 kvd} from k's.
struct NormRows {
  int64_t heads = 1, stride = 0;
};

// inp (N,C), weight (C) -> out (N,C), rstd (N) fp32 saved for the backward; inp and out laid out
// as rows says.
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int64_t N, int64_t C, float eps,
                     cudaStream_t stream, NormRows rows = {});

// Floats of scratch rmsnorm_backward needs: one partial dweight (C) per block.
int64_t rmsnorm_backward_scratch(int64_t N, int64_t C);

// dout, inp (N,C), weight (C), rstd (N) -> dinp (N,C) += dx; dweight (C, fp32) += dw unless null (a
// frozen gain). dw is summed per block of rows into scratch, then over blocks in block order: the
// same bits every run (no atomics).
template <typename T>
void rmsnorm_backward(T* dinp, float* dweight, float* scratch, const T* dout, const T* inp, const T* weight,
                      const float* rstd, int64_t N, int64_t C, cudaStream_t stream);

// The same in place: dx holds dout on entry and dinp (overwritten, not accumulated) on exit, dx and
// inp laid out as rows says. Scratch as above.
template <typename T>
void rmsnorm_backward_in_place(T* dx, float* dweight, float* scratch, const T* inp, const T* weight, const float* rstd,
                               int64_t N, int64_t C, cudaStream_t stream, NormRows rows = {});

}  // namespace jtok::cuda
