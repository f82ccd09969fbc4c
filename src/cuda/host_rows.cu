// The row gather from host (registered) or device memory (src/cuda/host_rows.h): one thread a
// 16-byte chunk of a row, kUnroll chunks a thread with every load issued before the first store (over
// PCIe a load waits microseconds: the more in flight, the closer to the link's rate). The grid covers
// the batch's bound N; blocks past U = *num_unique exit.
#include <cuda_bf16.h>

#include <type_traits>

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/host_rows.h"

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
  const Src* s = reinterpret_cast<const Src*>(&bits);
  Pack<Dst, K> p;
#pragma unroll
  for (int k = 0; k < K; ++k) p.v[k] = convert<Dst>(s[k]);
  *reinterpret_cast<Pack<Dst, K>*>(out) = p;
}

// src (rows, d), d a multiple of K = 16 / sizeof(Src), src and out aligned (vector_ok) -> out (U, d).
// Chunk i is row u = i / (d / K), elements (i % (d / K)) * K ..; its output starts at i * K.
template <typename Src, typename Dst>
__global__ void gather_vec_kernel(Dst* out, const Src* src, int64_t rows, int64_t d, const int32_t* unique,
                                  const int32_t* num_unique, int32_t* errors) {
  constexpr int K = 16 / sizeof(Src);
  const int64_t chunks = d / K, total = static_cast<int64_t>(*num_unique) * chunks;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x;
  uint4 v[kUnroll];
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int64_t i = first + static_cast<int64_t>(k) * blockDim.x;
    v[k] = make_uint4(0, 0, 0, 0);
    if (i >= total) continue;
    const int64_t c = i % chunks, r = checked_row(unique[i / chunks], rows, errors, c == 0);
    if (r >= 0) v[k] = *reinterpret_cast<const uint4*>(src + r * d + c * K);
  }
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int64_t i = first + static_cast<int64_t>(k) * blockDim.x;
    if (i < total) store_chunk<Src, Dst>(out + i * K, v[k]);
  }
}

// The reference: element i = (u, j) of out (U, d) from src[unique[u]][j], one a thread.
template <typename Src, typename Dst>
__global__ void gather_elem_kernel(Dst* out, const Src* src, int64_t rows, int64_t d, const int32_t* unique,
                                   const int32_t* num_unique, int32_t* errors) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(*num_unique) * d) return;
  const int64_t j = i % d, r = checked_row(unique[i / d], rows, errors, j == 0);
  out[i] = r >= 0 ? convert<Dst>(src[r * d + j]) : from_f32<Dst>(0.0f);
}

template <typename Src, typename Dst>
bool vector_ok(const Dst* out, const RowSource& src) {
  constexpr int64_t K = 16 / sizeof(Src);
  constexpr uintptr_t out_align = alignof(Pack<Dst, K>);
  return src.dim % K == 0 && reinterpret_cast<uintptr_t>(src.data) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(out) % out_align == 0;
}

template <typename Src, typename Dst>
void launch_gather(Dst* out, const RowSource& src, const DeviceRowBatch& rb, int64_t N, int32_t* errors, bool vector,
                   cudaStream_t stream) {
  const Src* s = static_cast<const Src*>(src.data);
  if (vector && vector_ok<Src>(out, src)) {
    const int64_t chunks = N * (src.dim / (16 / static_cast<int64_t>(sizeof(Src))));
    gather_vec_kernel<Src, Dst><<<ceil_div(chunks, int64_t{kThreads} * kUnroll), kThreads, 0, stream>>>(
        out, s, src.rows, src.dim, rb.unique, rb.num_unique, errors);
  } else {
    gather_elem_kernel<Src, Dst><<<ceil_div(N * src.dim, kThreads), kThreads, 0, stream>>>(
        out, s, src.rows, src.dim, rb.unique, rb.num_unique, errors);
  }
  JTOK_CUDA_CHECK_LAUNCH();
}

template <typename T>
void gather_any(T* out, const RowSource& src, const DeviceRowBatch& rb, int64_t N, const RowErrors& errors, bool vector,
                cudaStream_t stream) {
  JTOK_CHECK(N > 0 && N < (int64_t{1} << 31), "gather_rows_device: N = ", N);
  JTOK_CHECK(src.data != nullptr && src.rows > 0 && src.dim > 0, "gather_rows_device: an empty source (", src.rows,
             " x ", src.dim, ")");
  if (src.dtype == Dtype::f32)
    launch_gather<float>(out, src, rb, N, errors.words, vector, stream);
  else if (src.dtype == Dtype::bf16)
    launch_gather<uint16_t>(out, src, rb, N, errors.words, vector, stream);
  else
    fail("gather_rows_device: rows stored as ", dtype_name(src.dtype), " are not read by the GPU (f32 or bf16 only)");
}

}  // namespace

template <typename T>
void gather_rows_device(T* out, const RowSource& src, const DeviceRowBatch& rb, int64_t N, const RowErrors& errors,
                        cudaStream_t stream) {
  gather_any(out, src, rb, N, errors, true, stream);
}

template <typename T>
void gather_rows_device_ref(T* out, const RowSource& src, const DeviceRowBatch& rb, int64_t N, const RowErrors& errors,
                            cudaStream_t stream) {
  gather_any(out, src, rb, N, errors, false, stream);
}

template void gather_rows_device<float>(float*, const RowSource&, const DeviceRowBatch&, int64_t, const RowErrors&,
                                        cudaStream_t);
template void gather_rows_device<__nv_bfloat16>(__nv_bfloat16*, const RowSource&, const DeviceRowBatch&, int64_t,
                                                const RowErrors&, cudaStream_t);
template void gather_rows_device_ref<float>(float*, const RowSource&, const DeviceRowBatch&, int64_t, const RowErrors&,
                                            cudaStream_t);
template void gather_rows_device_ref<__nv_bfloat16>(__nv_bfloat16*, const RowSource&, const DeviceRowBatch&, int64_t,
                                                    const RowErrors&, cudaStream_t);

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
