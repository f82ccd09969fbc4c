// attention_mma*.cu (the bf16 tensor-core attention) is inline PTX: not emulated. attention.cu's
// launchers name it for bf16, so its symbols are defined here to stop the emulation loudly if a
// case ever reaches them (the cases call the scalar-tile launchers, attention_*_tiles).
#include <cstdio>
#include <cstdlib>

#include "cuda/attention_mma.h"

namespace jtok::cuda {

[[noreturn]] static void not_emulated(const char* fn) {
  std::fprintf(stderr, "cuda emulation: %s (inline PTX) is not emulated\n", fn);
  std::abort();
}

void attention_forward_mma(__nv_bfloat16*, float*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                           const AttnDims&, int, cudaStream_t) {
  not_emulated("attention_forward_mma");
}
void attention_backward_mma(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, const float*, const __nv_bfloat16*,
                            const float*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                            const AttnDims&, int, cudaStream_t) {
  not_emulated("attention_backward_mma");
}

}  // namespace jtok::cuda
