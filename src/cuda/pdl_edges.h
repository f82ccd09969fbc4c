// Programmatic dependent launch in a captured CUDA graph (Hopper): a kernel of jtok::cuda that
// follows another of jtok::cuda, and nothing else, may launch its blocks once all of the earlier
// kernel's blocks have begun (an edge from its launch-completion port, of the programmatic type)
// instead of after it has finished; every kernel of src/cuda waits for its predecessor in pdl_wait()
// before touching memory (cuda/pdl.cuh, tests/test_cuda_pdl_wait.py), so the bits are the same and
// the gap between two small kernels (a decode step is ~170 of them at batch 1) is hidden.
// Kernels of other libraries (cub's, cuBLASLt's), copies, event nodes and joins keep their edges.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace jtok::cuda {

// Makes graph's eligible kernel -> kernel edges programmatic; returns how many. Throws (naming the
// runtime call) where the runtime refuses: the graph is then not to be used (an edge may be gone).
int64_t make_programmatic_edges(cudaGraph_t graph);

}  // namespace jtok::cuda
