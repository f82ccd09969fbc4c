// AdamW (src/cuda/adamw.h): one thread an element (adamw_element.cuh: the CPU loop's order, no FMA
// contraction by nvcc; GCC may contract the CPU's, so the test allows fp32 rounding, not 0).
#include "cuda/adamw.h"
#include "cuda/adamw_element.cuh"
#include "cuda/check.h"
#include "cuda/common.cuh"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;

template <typename G>
__global__ void adamw_kernel(float* p, __nv_bfloat16* p_bf16, const G* g, float* m, float* v, int64_t n,
                             AdamWConsts c, const float* grad_scale) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float pi = p[i], mi = m[i], vi = v[i];
  adamw_element(pi, mi, vi, g ? to_f32(g[i]) : 0.0f, g != nullptr, grad_scale ? *grad_scale : 1.0f, c);
  m[i] = mi;
  v[i] = vi;
  p[i] = pi;
  if (p_bf16) p_bf16[i] = __float2bfloat16_rn(pi);
}

}  // namespace

template <typename G>
void adamw_update(float* p, __nv_bfloat16* p_bf16, const G* g, float* m, float* v, int64_t n, const AdamWConsts& c,
                  const float* grad_scale, cudaStream_t stream) {
  if (n == 0) return;
  adamw_kernel<G><<<ceil_div(n, kThreads), kThreads, 0, stream>>>(p, p_bf16, g, m, v, n, c, grad_scale);
  JTOK_CUDA_CHECK_LAUNCH();
}

template void adamw_update<float>(float*, __nv_bfloat16*, const float*, float*, float*, int64_t, const AdamWConsts&,
                                  const float*, cudaStream_t);
template void adamw_update<__nv_bfloat16>(float*, __nv_bfloat16*, const __nv_bfloat16*, float*, float*, int64_t,
                                          const AdamWConsts&, const float*, cudaStream_t);

}  // namespace jtok::cuda
