// Deduplication of token ids (src/cuda/dedup.h): iota positions, stable radix sort of (id,
// position) pairs over the bits V needs, run-length encode of the sorted ids (unique, counts),
// exclusive scan of the counts into offsets, then inverse by one block a unique id. The identity
// batch (no dedup): positions and their count.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/dedup.h"
#include "cuda/pdl.cuh"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) dedup_iota_kernel(int32_t* pos, int64_t N) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < N) pos[i] = static_cast<int32_t>(i);
}

// positions (N+1) = 0..N, count (1) = N.
__global__ void __launch_bounds__(kThreads) dedup_identity_kernel(int32_t* positions, int32_t* count, int64_t N) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i <= N) positions[i] = static_cast<int32_t>(i);
  if (i == 0) *count = static_cast<int32_t>(N);
}

// Block u (< U) writes inverse[order[i]] = u for its run.
__global__ void __launch_bounds__(kThreads)
    dedup_inverse_kernel(int32_t* inverse, const int32_t* order, const int32_t* offsets, const int32_t* num_unique) {
  pdl_wait();
  const int u = blockIdx.x;
  if (u >= *num_unique) return;
  for (int i = offsets[u] + threadIdx.x; i < offsets[u + 1]; i += blockDim.x) inverse[order[i]] = u;
}

int key_bits(int64_t V) {
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) < V) ++bits;
  return bits;
}

// The layout of scratch: sorted keys (N), positions before sorting (N), counts (N+1), then cub's
// temporary storage (the largest of the three calls').
struct Scratch {
  int32_t *keys, *pos, *counts;
  void* temp;
  size_t temp_bytes;
};

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

size_t cub_temp_bytes(int64_t N, int64_t V) {
  const int n = static_cast<int>(N);
  size_t sort = 0, rle = 0, scan = 0;
  JTOK_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort, static_cast<const int32_t*>(nullptr),
                                                  static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                  static_cast<int32_t*>(nullptr), n, 0, key_bits(V)));
  JTOK_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, rle, static_cast<const int32_t*>(nullptr),
                                                     static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                                     static_cast<int32_t*>(nullptr), n));
  JTOK_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), n + 1));
  return std::max(sort, std::max(rle, scan));
}

Scratch carve(void* scratch, int64_t N) {
  char* p = static_cast<char*>(scratch);
  Scratch s;
  const size_t ints = align256(static_cast<size_t>(N + 1) * sizeof(int32_t));
  s.keys = reinterpret_cast<int32_t*>(p);
  s.pos = reinterpret_cast<int32_t*>(p + ints);
  s.counts = reinterpret_cast<int32_t*>(p + 2 * ints);
  s.temp = p + 3 * ints;
  return s;
}

}  // namespace

size_t dedup_scratch_bytes(int64_t N, int64_t V) {
  return 3 * align256(static_cast<size_t>(N + 1) * sizeof(int32_t)) + cub_temp_bytes(N, V);
}

void dedup_ids(const DeviceRowBatch& rb, const int32_t* ids, int64_t N, int64_t V, void* scratch, size_t scratch_bytes,
               cudaStream_t stream) {
  JTOK_CHECK(N > 0 && N < (int64_t{1} << 31), "dedup_ids: N = ", N);
  JTOK_CHECK(scratch_bytes >= dedup_scratch_bytes(N, V), "dedup_ids: scratch of ", scratch_bytes, " bytes is short");
  Scratch s = carve(scratch, N);
  s.temp_bytes = scratch_bytes - 3 * align256(static_cast<size_t>(N + 1) * sizeof(int32_t));
  const int n = static_cast<int>(N);
  dedup_iota_kernel<<<ceil_div(N, kThreads), kThreads, 0, stream>>>(s.pos, N);
  JTOK_CUDA_CHECK_LAUNCH();
  // Stable: equal ids keep their positions in increasing order (dedup_ids' std::stable_sort).
  JTOK_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.temp, s.temp_bytes, ids, s.keys, s.pos, rb.order, n, 0, key_bits(V),
                                                  stream));
  JTOK_CUDA_CHECK(cudaMemsetAsync(s.counts, 0, static_cast<size_t>(N + 1) * sizeof(int32_t), stream));
  JTOK_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(s.temp, s.temp_bytes, s.keys, rb.unique, s.counts, rb.num_unique, n,
                                                     stream));
  // counts past U are 0: offsets[u] for u <= U, and N beyond.
  JTOK_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(s.temp, s.temp_bytes, s.counts, rb.offsets, n + 1, stream));
  dedup_inverse_kernel<<<static_cast<int>(entry_blocks(rb, N)), kThreads, 0, stream>>>(rb.inverse, rb.order, rb.offsets,
                                                                                       rb.num_unique);
  JTOK_CUDA_CHECK_LAUNCH();
}

void fill_positions(int32_t* positions, int32_t* count, int64_t N, cudaStream_t stream) {
  JTOK_CHECK(N > 0 && N < (int64_t{1} << 31), "fill_positions: N = ", N);
  dedup_identity_kernel<<<ceil_div(N + 1, kThreads), kThreads, 0, stream>>>(positions, count, N);
  JTOK_CUDA_CHECK_LAUNCH();
}

}  // namespace jtok::cuda
