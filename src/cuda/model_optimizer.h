// One optimizer step of the device model (cuda/model.h), train/optimizer.cpp's optimizer_step on
// the GPU: the global gradient norm over the flat fp32 gradients (cuda/global_norm.h: the CPU's
// 4096-element chunks), its clip coefficient (kept on the device), then AdamW per parameter tensor
// (cuda/adamw.h) with the decoupled weight decay on the 2-D weights only (ParamInfo::decay), the
// fp32 masters updated and, for a bf16 model, the forward's bf16 copy rewritten.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/adamw.h"
#include "cuda/device_array.h"
#include "cuda/model.h"

namespace jtok::cuda {

// fp32 moments of every flat parameter, and the norm's scratch.
struct DeviceAdamW {
  DeviceAdamW(int64_t n_params, cudaStream_t stream);  // moments zero
  DeviceArray<float> m, v;      // (n_params), m.params' layout
  DeviceArray<float> partials;  // (sumsq_chunks(n_params))
  DeviceArray<double> sumsq, norm;  // (1), (1)
  DeviceArray<float> clip;      // (1) the clip coefficient AdamW reads
  int64_t step = 0;             // steps taken
};

// decay: the step's constants for the 2-D weights (jtok::adamw_consts at this step's lr, the
// config's weight decay); plain: the same with weight decay 0 (gains, biases). max_grad_norm <= 0:
// no clipping. The norm is read back (one sync): a non-finite one fails before any weight or moment
// moves, as on the CPU. Returns the gradient norm; gradients are left as they are.
template <typename E>
double optimizer_step(DeviceModel<E>& dm, DeviceAdamW& st, const AdamWConsts& decay, const AdamWConsts& plain,
                      float max_grad_norm);

}  // namespace jtok::cuda
