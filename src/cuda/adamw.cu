// AdamW (src/cuda/adamw.h): one thread an element (adamw_element.cuh: the CPU loop's order, no FMA
// contraction by nvcc; GCC may contract the CPU's, so the test allows fp32 rounding, not 0); a block
// finds its segment by a binary search over the segments' first blocks.
#include "core/error.h"
#include "cuda/adamw.h"
#include "cuda/adamw_element.cuh"
#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/pdl.cuh"

namespace jtok::cuda {

namespace {

template <typename G>
__global__ void __launch_bounds__(kAdamWThreads)
    adamw_kernel(float* p, __nv_bfloat16* p_bf16, const G* g, float* m, float* v, const AdamWSegment* segments,
                 int n_segments, AdamWKinds kinds, const float* grad_scale) {
  pdl_wait();
  const int64_t b = blockIdx.x;
  int lo = 0, hi = n_segments - 1;  // the last segment whose first block is <= b
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (segments[mid].first_block <= b) lo = mid;
    else hi = mid - 1;
  }
  const AdamWSegment s = segments[lo];
  const int64_t j = (b - s.first_block) * kAdamWThreads + threadIdx.x;
  if (j >= s.numel) return;
  const int64_t i = s.offset + j;
  float pi = p[i], mi = m[i], vi = v[i];
  adamw_element(pi, mi, vi, g ? to_f32(g[i]) : 0.0f, g != nullptr, grad_scale ? *grad_scale : 1.0f, kinds.k[s.kind]);
  m[i] = mi;
  v[i] = vi;
  p[i] = pi;
  if (p_bf16) p_bf16[i] = __float2bfloat16_rn(pi);
}

}  // namespace

std::vector<AdamWSegment> adamw_segments(const std::vector<AdamWSegment>& ranges, int64_t& blocks) {
  std::vector<AdamWSegment> out;
  int64_t end = 0;
  for (const AdamWSegment& r : ranges) {
    if (r.offset < end || r.numel < 0 || r.kind < 0 || r.kind >= kAdamWKinds)
      fail("adamw_segments: a range at ", r.offset, " of ", r.numel, " elements, kind ", r.kind,
           " (ranges in increasing order, not overlapping; kinds 0..", kAdamWKinds - 1, ")");
    end = r.offset + r.numel;
    if (r.numel == 0) continue;
    if (!out.empty() && out.back().kind == r.kind && out.back().offset + out.back().numel == r.offset)
      out.back().numel += r.numel;
    else
      out.push_back(r);
  }
  blocks = 0;
  for (AdamWSegment& s : out) {
    s.first_block = blocks;
    blocks += (s.numel + kAdamWThreads - 1) / kAdamWThreads;
  }
  return out;
}

template <typename G>
void adamw_update(float* p, __nv_bfloat16* p_bf16, const G* g, float* m, float* v, const AdamWSegment* segments,
                  int64_t n_segments, int64_t blocks, const AdamWKinds& kinds, const float* grad_scale,
                  cudaStream_t stream) {
  if (n_segments == 0 || blocks == 0) return;
  if (blocks > 0x7fffffff || n_segments > 0x7fffffff)
    fail("adamw_update: ", blocks, " blocks over ", n_segments, " segments (at most 2^31 - 1)");
  adamw_kernel<G><<<static_cast<unsigned>(blocks), kAdamWThreads, 0, stream>>>(
      p, p_bf16, g, m, v, segments, static_cast<int>(n_segments), kinds, grad_scale);
  JTOK_CUDA_CHECK_LAUNCH();
}

template void adamw_update<float>(float*, __nv_bfloat16*, const float*, float*, float*, const AdamWSegment*, int64_t,
                                  int64_t, const AdamWKinds&, const float*, cudaStream_t);
template void adamw_update<__nv_bfloat16>(float*, __nv_bfloat16*, const __nv_bfloat16*, float*, float*,
                                          const AdamWSegment*, int64_t, int64_t, const AdamWKinds&, const float*,
                                          cudaStream_t);

}  // namespace jtok::cuda
