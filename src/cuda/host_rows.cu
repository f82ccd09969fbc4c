// The row gather from host (registered) or device memory (src/cuda/host_rows.h): one thread a
// 16-byte chunk of a row, kUnroll chunks a thread with every load issued before the first store (over
// PCIe a load waits microseconds: the more in flight, the closer to the link's rate). The grid covers
// the batch's bound N; blocks past U = *num_unique exit.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/host_rows.h"
#include "cuda/pdl.cuh"

namespace jtok::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

// One stored element (f32, or bf16 bits) in the output type: f32 -> bf16 rounds to nearest even,
// bf16 -> f32 is exact (the bits in the upper half), a same-type copy keeps the bits.
template <typename Dst>
__device__ __forceinline__ Dst convert(float x) {
  return from_f32<Dst>(x);
}
template <typename Dst>
__device__ __forceinline__ Dst convert(uint16_t b) {
  if constexpr (std::is_same_v<Dst, float>)
    return __uint_as_float(static_cast<uint32_t>(b) << 16);
  else
    return __ushort_as_bfloat16(b);
}

// id's row in a source of `rows` rows, or -1 (an id out of range: counted once per row, by the
// thread that reads the row's first chunk; max and min are order-independent).
__device__ __forceinline__ int64_t checked_row(int32_t id, int64_t rows, int32_t* errors, bool report) {
  if (id >= 0 && id < rows) return id;
  if (report && errors) {
    atomicAdd(errors, 1);
    if (id >= 0) atomicMax(errors + 1, id);
    else atomicMin(errors + 2, id);
  }
  return -1;
}

// The K outputs of one 16-byte chunk of Src, stored at once (16 bytes, or 8 for f32 -> bf16; a
// 32-byte bf16 -> f32 chunk as two 16-byte stores).
template <typename Dst, int K>
struct alignas(K * sizeof(Dst) < 16 ? K * sizeof(Dst) : 16) Pack {
  Dst v[K];
};

template <typename Src, typename Dst>
__device__ __forceinline__ void store_chunk(Dst* out, const uint4& bits) {
  constexpr int K = 16 / sizeof(Src);
  Src s[K];  // the chunk's elements (memcpy: a Src view of bits would break strict aliasing)
  memcpy(s, &bits, sizeof(s));
  Pack<Dst, K> p;
#pragma unroll
  for (int k = 0; k < K; ++k) p.v[k] = convert<Dst>(s[k]);
  *reinterpret_cast<Pack<Dst, K>*>(out) = p;
}

// Up to kMaxGatherTables tables of one shape read in one launch (JTok-M's n_e, beside JTok's): table
// blockIdx.y reads src[y] into out[y]. Passed by value (kernel parameters).
template <typename Src, typename Dst>
struct GatherArgs {
  const Src* src[kMaxGatherTables];
  Dst* out[kMaxGatherTables];
};

// src (rows, d), d a multiple of K = 16 / sizeof(Src), src and out aligned (vector_ok) -> out (U, d).
// Chunk i is row u = i / (d / K), elements (i % (d / K)) * K ..; its output starts at i * K. Ids out
// of range are reported by table 0's blocks only (a count of ids, not of tables).
template <typename Src, typename Dst>
__global__ void __launch_bounds__(kThreads)
    gather_vec_kernel(GatherArgs<Src, Dst> a, int64_t rows, int64_t d, const int32_t* unique, const int32_t* num_unique,
                      int32_t* errors) {
  pdl_wait();
  constexpr int K = 16 / sizeof(Src);
  const Src* src = a.src[blockIdx.y];
  const int64_t chunks = d / K, total = static_cast<int64_t>(*num_unique) * chunks;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x;
  uint4 v[kUnroll];
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int64_t i = first + static_cast<int64_t>(k) * blockDim.x;
    v[k] = make_uint4(0, 0, 0, 0);
    if (i >= total) continue;
    const int64_t c = i % chunks, r = checked_row(unique[i / chunks], rows, errors, c == 0 && blockIdx.y == 0);
    if (r >= 0) v[k] = *reinterpret_cast<const uint4*>(src + r * d + c * K);
  }
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int64_t i = first + static_cast<int64_t>(k) * blockDim.x;
    if (i < total) store_chunk<Src, Dst>(a.out[blockIdx.y] + i * K, v[k]);
  }
}

// The reference: element i = (u, j) of out (U, d) from src[unique[u]][j], one a thread.
template <typename Src, typename Dst>
__global__ void __launch_bounds__(kThreads)
    gather_elem_kernel(GatherArgs<Src, Dst> a, int64_t rows, int64_t d, const int32_t* unique,
                       const int32_t* num_unique, int32_t* errors) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(*num_unique) * d) return;
  const int64_t j = i % d, r = checked_row(unique[i / d], rows, errors, j == 0 && blockIdx.y == 0);
  a.out[blockIdx.y][i] = r >= 0 ? convert<Dst>(a.src[blockIdx.y][r * d + j]) : from_f32<Dst>(0.0f);
}

// 16-byte loads need every source and output aligned (and d a multiple of a chunk).
template <typename Src, typename Dst>
bool vector_ok(const GatherArgs<Src, Dst>& a, int n, int64_t d) {
  constexpr int64_t K = 16 / sizeof(Src);
  constexpr uintptr_t out_align = alignof(Pack<Dst, K>);
  bool ok = d % K == 0;
  for (int t = 0; t < n; ++t)
    ok = ok && reinterpret_cast<uintptr_t>(a.src[t]) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(a.out[t]) % out_align == 0;
  return ok;
}

template <typename Src, typename Dst>
void launch_gather(Dst* const* outs, const RowSource* srcs, int n, const DeviceRowBatch& rb, int64_t N,
                   int32_t* errors, bool vector, cudaStream_t stream) {
  GatherArgs<Src, Dst> a{};
  for (int t = 0; t < n; ++t) {
    a.src[t] = static_cast<const Src*>(srcs[t].data);
    a.out[t] = outs[t];
  }
  const int64_t rows = srcs[0].rows, d = srcs[0].dim;
  if (vector && vector_ok(a, n, d)) {
    const int64_t chunks = N * (d / (16 / static_cast<int64_t>(sizeof(Src))));
    const dim3 grid(ceil_div(chunks, int64_t{kThreads} * kUnroll), static_cast<unsigned>(n));
    gather_vec_kernel<Src, Dst><<<grid, kThreads, 0, stream>>>(a, rows, d, rb.unique, rb.num_unique, errors);
  } else {
    const dim3 grid(ceil_div(N * d, kThreads), static_cast<unsigned>(n));
    gather_elem_kernel<Src, Dst><<<grid, kThreads, 0, stream>>>(a, rows, d, rb.unique, rb.num_unique, errors);
  }
  JTOK_CUDA_CHECK_LAUNCH();
}

// n sources of one shape and dtype, checked; then one launch per kMaxGatherTables of them.
template <typename T>
void gather_any(T* const* outs, const RowSource* srcs, int n, const DeviceRowBatch& rb, int64_t N,
                const RowErrors& errors, bool vector, cudaStream_t stream) {
  JTOK_CHECK(N > 0 && N < (int64_t{1} << 31), "gather_rows_device: N = ", N);
  JTOK_CHECK(n > 0, "gather_rows_device: no table");
  const RowSource& s0 = srcs[0];
  for (int t = 0; t < n; ++t) {
    const RowSource& s = srcs[t];
    JTOK_CHECK(s.data != nullptr && s.rows > 0 && s.dim > 0, "gather_rows_device: table ", t, " is empty (", s.rows,
               " x ", s.dim, ")");
    if (s.rows != s0.rows || s.dim != s0.dim || s.dtype != s0.dtype)
      fail("gather_rows_device: table ", t, " is ", s.rows, " x ", s.dim, " ", dtype_name(s.dtype), ", table 0 ",
           s0.rows, " x ", s0.dim, " ", dtype_name(s0.dtype));
  }
  if (s0.dtype != Dtype::f32 && s0.dtype != Dtype::bf16)
    fail("gather_rows_device: rows stored as ", dtype_name(s0.dtype), " are not read by the GPU (f32 or bf16 only)");
  for (int t = 0; t < n; ++t)  // an element's own alignment at least (a mapped file's tables may be 2 bytes off)
    if (reinterpret_cast<uintptr_t>(srcs[t].data) % static_cast<uintptr_t>(dtype_bytes(s0.dtype)) != 0)
      fail("gather_rows_device: table ", t, "'s rows start at ", srcs[t].data, ", not aligned to their ",
           dtype_bytes(s0.dtype), "-byte ", dtype_name(s0.dtype), " elements");
  for (int t0 = 0; t0 < n; t0 += kMaxGatherTables) {
    const int m = std::min(n - t0, kMaxGatherTables);
    if (s0.dtype == Dtype::f32)
      launch_gather<float>(outs + t0, srcs + t0, m, rb, N, t0 == 0 ? errors.words : nullptr, vector, stream);
    else
      launch_gather<uint16_t>(outs + t0, srcs + t0, m, rb, N, t0 == 0 ? errors.words : nullptr, vector, stream);
  }
}

}  // namespace

template <typename T>
void gather_rows_device(T* out, const RowSource& src, const DeviceRowBatch& rb, int64_t N, const RowErrors& errors,
                        cudaStream_t stream) {
  gather_any(&out, &src, 1, rb, N, errors, true, stream);
}

template <typename T>
void gather_rows_device_ref(T* out, const RowSource& src, const DeviceRowBatch& rb, int64_t N, const RowErrors& errors,
                            cudaStream_t stream) {
  gather_any(&out, &src, 1, rb, N, errors, false, stream);
}

template <typename T>
void gather_rows_device_tables(T* const* outs, const RowSource* srcs, int n, const DeviceRowBatch& rb, int64_t N,
                               const RowErrors& errors, cudaStream_t stream) {
  gather_any(outs, srcs, n, rb, N, errors, true, stream);
}

#define JTOK_HOST_ROWS_INSTANTIATE(T)                                                                               \
  template void gather_rows_device<T>(T*, const RowSource&, const DeviceRowBatch&, int64_t, const RowErrors&,      \
                                      cudaStream_t);                                                               \
  template void gather_rows_device_ref<T>(T*, const RowSource&, const DeviceRowBatch&, int64_t, const RowErrors&,  \
                                          cudaStream_t);                                                           \
  template void gather_rows_device_tables<T>(T* const*, const RowSource*, int, const DeviceRowBatch&, int64_t,     \
                                             const RowErrors&, cudaStream_t);
JTOK_HOST_ROWS_INSTANTIATE(float)
JTOK_HOST_ROWS_INSTANTIATE(__nv_bfloat16)
#undef JTOK_HOST_ROWS_INSTANTIATE

void reset_row_errors(const RowErrors& e, cudaStream_t stream) {
  JTOK_CHECK(e.words != nullptr, "reset_row_errors: no error words");
  JTOK_CUDA_CHECK(cudaMemsetAsync(e.words, 0, 3 * sizeof(int32_t), stream));
  JTOK_CUDA_CHECK(cudaMemsetAsync(e.words + 1, 0xff, sizeof(int32_t), stream));  // -1: no id >= rows yet
}

void check_row_errors(const RowErrors& e, int64_t rows, const char* what, cudaStream_t stream) {
  int32_t w[3] = {0, -1, 0};
  JTOK_CUDA_CHECK(cudaStreamSynchronize(stream));
  JTOK_CUDA_CHECK(cudaMemcpy(w, e.words, sizeof(w), cudaMemcpyDeviceToHost));
  if (w[0] == 0) return;
  fail(what, ": ", w[0], " token id(s) outside the table's ", rows, " rows",
       w[1] >= 0 ? " (largest " + std::to_string(w[1]) + ")" : std::string(),
       w[2] < 0 ? " (smallest " + std::to_string(w[2]) + ")" : std::string(), "; their rows were read as zeros");
}

void check_ids_in_range(const int32_t* ids, int64_t n, int64_t rows, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= rows)
      fail(what, ": token id ", ids[i], " at position ", i, " outside the table's ", rows, " rows");
}

}  // namespace jtok::cuda
