// The device model's optimizer step (src/cuda/model_optimizer.h).
#include <cmath>

#include "cuda/global_norm.h"
#include "cuda/model_optimizer.h"

namespace jtok::cuda {

DeviceAdamW::DeviceAdamW(int64_t n_params, cudaStream_t stream)
    : m(n_params), v(n_params), partials(sumsq_chunks(n_params)), sumsq(1), norm(1), clip(1) {
  m.zero(stream);
  v.zero(stream);
}

template <typename E>
double optimizer_step(DeviceModel<E>& dm, DeviceAdamW& st, const AdamWConsts& decay, const AdamWConsts& plain,
                      float max_grad_norm) {
  if (dm.n_tables > 0)
    fail("cuda model: the token tables' optimizer (cuda/table_adamw.h) is not in the GPU model's step yet");
  cudaStream_t s = dm.stream;
  sumsq_partials(st.partials.get(), dm.grads.get(), dm.n_params, s);
  sum_partials(st.sumsq.get(), st.partials.get(), st.partials.size(), s);
  clip_coef(st.clip.get(), st.norm.get(), st.sumsq.get(), max_grad_norm, s);
  double norm = 0;
  copy_to_host(&norm, st.norm.get(), 1, s);
  if (!std::isfinite(norm))
    fail("cuda model: the global gradient norm is ", norm, "; the step was not applied (no weight or moment changed)");
  st.step += 1;
  for (const ParamInfo& p : dm.layout) {
    __nv_bfloat16* copy = nullptr;  // the bf16 forward's copy of this tensor, rewritten from the new masters
    if constexpr (!std::is_same_v<E, float>) copy = dm.copy.get() + p.offset;
    adamw_update<float>(dm.master.get() + p.offset, copy, dm.grads.get() + p.offset, st.m.get() + p.offset,
                        st.v.get() + p.offset, p.numel, p.decay ? decay : plain, st.clip.get(), s);
  }
  return norm;
}

template double optimizer_step<float>(DeviceModel<float>&, DeviceAdamW&, const AdamWConsts&, const AdamWConsts&, float);
template double optimizer_step<__nv_bfloat16>(DeviceModel<__nv_bfloat16>&, DeviceAdamW&, const AdamWConsts&,
                                              const AdamWConsts&, float);

}  // namespace jtok::cuda
