// Programmatic dependent launch (Hopper, sm_90): every kernel of src/cuda starts with pdl_wait(),
// so a CUDA graph may let a kernel's blocks launch while the kernel before it still runs (an edge
// from its launch-completion port, cuda/decoder_step.cu's programmatic_edges): they wait here for
// that kernel to finish and its writes to be visible before touching memory. Launched any other
// way (no programmatic prerequisite) it returns at once. tests/test_cuda_pdl_wait.py holds every
// kernel to it: the edges are made for kernels of jtok::cuda by name.
#pragma once

namespace jtok::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" : : : "memory");
#endif
}

}  // namespace jtok::cuda
