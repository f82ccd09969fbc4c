// A step's AdamW constants as the GPU's optimizer takes them: a plain header (no CUDA types), so the
// trainer's g++ code (train/tables_cuda.cpp) forms them and the kernels (cuda/adamw.h,
// cuda/model_optimizer.h) read the same structs.
#pragma once

namespace jtok::cuda {

// One kind of tensor's: src/ops/adamw.h's AdamWStepConsts less grad_scale (the clip coefficient is
// read on the device); fill from jtok::adamw_consts.
struct AdamWConsts {
  float b1, b2, eps, step_size, inv_sqrt_bc2, decay;
};

// A step's AdamW constants (jtok::adamw_consts at the step's lr) by kind of tensor: the backbone's
// 2-D weights (decay) and the rest (plain: weight decay 0); the token-indexed modules' at their own
// lr (train/optimizer.cpp's table_lr): 2-D (the tables, JTok-M's routers) and 1-D (the scalers).
struct StepConsts {
  AdamWConsts decay, plain, table_decay, table_plain;
};

}  // namespace jtok::cuda
