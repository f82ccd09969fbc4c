// cuda/pdl_edges.h: the graph's edges read, and the eligible ones replaced one at a time.
#include <cstring>
#include <map>
#include <vector>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/pdl_edges.h"

namespace jtok::cuda {

namespace {

// Whether node is a kernel of jtok::cuda, by its name.
bool ours(cudaGraphNode_t node) {
  cudaGraphNodeType type;
  JTOK_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
  if (type != cudaGraphNodeTypeKernel) return false;
  cudaKernelNodeParams p{};
  const char* name = nullptr;
  if (cudaGraphKernelNodeGetParams(node, &p) != cudaSuccess || cudaFuncGetName(&name, p.func) != cudaSuccess ||
      !name) {
    cudaGetLastError();
    return false;  // a kernel the runtime cannot name (a driver-API launch's) keeps its edge
  }
  // The entry's mangled name (namespaces jtok, cuda), or a demangled one where a runtime gives that.
  return std::strncmp(name, "_ZN4jtok4cuda", 13) == 0 || std::strncmp(name, "jtok::cuda::", 12) == 0 ||
         std::strstr(name, " jtok::cuda::") != nullptr;
}

}  // namespace

int64_t make_programmatic_edges(cudaGraph_t graph) {
  size_t n = 0;
  JTOK_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  JTOK_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n));
  std::map<cudaGraphNode_t, int> incoming;
  for (size_t i = 0; i < n; ++i) ++incoming[to[i]];
  int64_t made = 0;
  for (size_t i = 0; i < n; ++i) {
    const cudaGraphEdgeData& d = data[i];
    if (d.type != cudaGraphDependencyTypeDefault || d.from_port != 0 || incoming[to[i]] != 1) continue;
    if (!ours(from[i]) || !ours(to[i])) continue;
    JTOK_CUDA_CHECK(cudaGraphRemoveDependencies(graph, &from[i], &to[i], &data[i], 1));
    cudaGraphEdgeData e{};
    e.from_port = cudaGraphKernelNodePortLaunchCompletion;
    e.type = cudaGraphDependencyTypeProgrammatic;
    const cudaError_t added = cudaGraphAddDependencies(graph, &from[i], &to[i], &e, 1);
    if (added != cudaSuccess) {
      cudaGetLastError();
      JTOK_CUDA_CHECK(cudaGraphAddDependencies(graph, &from[i], &to[i], &data[i], 1));  // the edge back as it was
      JTOK_CUDA_CHECK(added);
    }
    ++made;
  }
  return made;
}

}  // namespace jtok::cuda
