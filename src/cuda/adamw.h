// AdamW on the GPU with fp32 master weights and moments, src/ops/adamw.h's update element for
// element (the constants from jtok::adamw_consts, computed once a step on the host):
//   g' = g * grad_scale;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2;
//   p = p * decay - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps)
// The clip coefficient is read on the device (global_norm.h's clip_coef), so a step needs no sync.
// One launch steps every tensor of a flat buffer (the model's parameters): the tensors to step are
// listed once as segments (adamw_segments), each with its kind of constants; a frozen tensor is in
// no segment and is not touched.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "cuda/step_consts.h"

namespace jtok::cuda {

constexpr int kAdamWThreads = 256;  // elements a block

// Elements [offset, offset + numel) stepped with the constants of `kind` (an index into AdamWKinds);
// first_block: the segment's first block of kAdamWThreads elements in the launch.
struct AdamWSegment {
  int64_t offset = 0, numel = 0, first_block = 0;
  int32_t kind = 0;
};
constexpr int kAdamWKinds = 4;
struct AdamWKinds {
  AdamWConsts k[kAdamWKinds];
};

// The launch's segments from ranges (offset, numel, kind) in increasing, non-overlapping order:
// neighbours of one kind that touch merged, empty ones dropped, first_block filled. `blocks` gets
// the launch's block count. Refuses ranges out of order or a kind past kAdamWKinds.
std::vector<AdamWSegment> adamw_segments(const std::vector<AdamWSegment>& ranges, int64_t& blocks);

// p, m, v fp32, updated in place where the segments (n_segments on the device, `blocks` blocks: from
// adamw_segments) say; g of G (float or __nv_bfloat16), null: a zero gradient (only the decays), as
// the CPU's adamw_elements; grad_scale: one float on the device multiplying g (null: 1); p_bf16:
// the bf16 copy the forward reads, written from the new p unless null.
template <typename G>
void adamw_update(float* p, __nv_bfloat16* p_bf16, const G* g, float* m, float* v, const AdamWSegment* segments,
                  int64_t n_segments, int64_t blocks, const AdamWKinds& kinds, const float* grad_scale,
                  cudaStream_t stream);

}  // namespace jtok::cuda
