// The touched-row list (src/cuda/table_rows.h): cub's stable compaction of the flags' indices, and a
// block a listed row (grid-stride) to clear it.
#include <thrust/iterator/counting_iterator.h>

#include <cub/device/device_select.cuh>
#include <limits>

#include "cuda/check.h"
#include "cuda/pdl.cuh"
#include "cuda/table_rows.h"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxBlocks = 2048;

__global__ void __launch_bounds__(kThreads) table_clear_rows_kernel(float* g, uint8_t* touched, const int32_t* rows,
                                                                    const int32_t* count, int64_t n, int64_t d) {
  pdl_wait();
  const int64_t total = count ? *count : n;
  for (int64_t i = blockIdx.x; i < total; i += gridDim.x) {
    const int64_t r = rows[i];
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) g[r * d + j] = 0.0f;
    if (threadIdx.x == 0) touched[r] = 0;
  }
}

__global__ void __launch_bounds__(kThreads)
    table_touched_positions_kernel(int32_t* pos, const int32_t* rows, const int32_t* count, const int32_t* values,
                                   int64_t n) {
  pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  int32_t lo = 0, hi = *count;  // the answer lies in [lo, hi]
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (rows[mid] < values[i])
      lo = mid + 1;
    else
      hi = mid;
  }
  pos[i] = lo;
}

void check_count(int64_t n) {
  JTOK_CHECK(n >= 0 && n <= std::numeric_limits<int32_t>::max(), "select_touched_rows: ", n,
             " rows do not fit the int32 list");
}

}  // namespace

size_t touched_rows_scratch_bytes(int64_t n) {
  check_count(n);
  if (n == 0) return 0;
  size_t bytes = 0;
  JTOK_CUDA_CHECK(cub::DeviceSelect::Flagged(nullptr, bytes, thrust::counting_iterator<int32_t>(0),
                                             static_cast<const uint8_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), n));
  return bytes;
}

void select_touched_rows(int32_t* rows, int32_t* count, const uint8_t* touched, int64_t n, void* scratch,
                       size_t scratch_bytes, cudaStream_t stream) {
  check_count(n);
  if (n == 0) {
    JTOK_CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof(int32_t), stream));
    return;
  }
  size_t bytes = scratch_bytes;
  JTOK_CUDA_CHECK(cub::DeviceSelect::Flagged(scratch, bytes, thrust::counting_iterator<int32_t>(0), touched, rows,
                                             count, n, stream));
}

void touched_positions(int32_t* pos, const int32_t* rows, const int32_t* count, const int32_t* values, int64_t n,
                       cudaStream_t stream) {
  if (n == 0) return;
  const int blocks = static_cast<int>((n + kThreads - 1) / kThreads);
  table_touched_positions_kernel<<<blocks, kThreads, 0, stream>>>(pos, rows, count, values, n);
  JTOK_CUDA_CHECK_LAUNCH();
}

void clear_rows(float* g, uint8_t* touched, const int32_t* rows, const int32_t* count, int64_t n, int64_t d,
                cudaStream_t stream) {
  if (n == 0) return;
  const int blocks = static_cast<int>(n < kMaxBlocks ? n : kMaxBlocks);
  table_clear_rows_kernel<<<blocks, kThreads, 0, stream>>>(g, touched, rows, count, n, d);
  JTOK_CUDA_CHECK_LAUNCH();
}

void RowFlags::allocate(int64_t n, cudaStream_t stream) {
  flags.resize(n);
  flags.zero(stream);
  rows.resize(n);
  count.resize(1);
  count.zero(stream);
  scratch.resize(static_cast<int64_t>(touched_rows_scratch_bytes(n)));
  flagged = false;
}

void RowFlags::list(cudaStream_t stream) {
  select_touched_rows(rows.get(), count.get(), flags.get(), flags.size(), scratch.get(), scratch.bytes(), stream);
}

void RowFlags::flag(int64_t row) {
  const uint8_t one = 1;
  copy_to_device(flags.get() + row, &one, 1);
  flagged = true;
}

void RowFlags::clear(float* g, int64_t d, cudaStream_t stream) {
  list(stream);
  clear_rows(g, flags.get(), rows.get(), count.get(), rows.size(), d, stream);
  flagged = false;
}

}  // namespace jtok::cuda
