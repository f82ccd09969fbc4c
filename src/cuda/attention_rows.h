// Which of the bf16 tensor-core attention's two kernels a model's steps run (cuda/attention.h): 16 query
// rows a warp (attention_forward, attention_backward's dq) or 32 (attention_forward_wide,
// attention_backward_wide). They give the same bits, so the choice is speed alone: the model times both
// on its own shape before its first step and keeps the faster (cuda/model.h's DeviceModel::attn_rows).
// Plain header: the CPU build's trainer reads it (cuda/training.h).
#pragma once

namespace jtok::cuda {

struct AttentionRows {
  int fwd = 0, bwd = 0;  // 16 or 32; 0: not chosen yet (fp32 models never choose: 16)
  // Milliseconds a call, by CUDA events after a warm-up call, at 16 and at 32 rows a warp (0: not timed,
  // e.g. hd 128, which has no 32-row kernels). bwd_ms: the whole backward (row terms, dq, dk dv).
  double fwd_ms[2] = {0, 0}, bwd_ms[2] = {0, 0};
};

}  // namespace jtok::cuda
