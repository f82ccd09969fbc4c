// The cub device-wide calls src/cuda makes (dedup.cu, table_rows.cu), on the host (device memory is
// host memory here): the temporary-storage size query when d_temp_storage is null, answered at
// once, else the work, submitted on the call's stream (emu::submit: run now, or recorded into the
// graph the stream captures, its arguments as they are now, as cub's kernels are). Each asks
// n * 8 + 256 bytes and fills them with 0xff before the work, so a caller that sizes or carves its
// scratch short is refused (cudaErrorInvalidValue, as cub's) or caught by EMU_SANITIZE=1. Only
// these entry points: a new cub call fails to compile here.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "cuda_runtime.h"

namespace cub {
namespace emu_detail {

inline size_t temp_bytes(int64_t n) { return static_cast<size_t>(n) * 8 + 256; }
// nullptr: a size query (bytes set); else the storage checked and scribbled. Returns whether to work.
inline cudaError_t take_temp(void* d_temp, size_t& bytes, int64_t n, bool& work) {
  work = false;
  if (n < 0) return cudaErrorInvalidValue;
  if (!d_temp) {
    bytes = temp_bytes(n);
    return cudaSuccess;
  }
  if (bytes < temp_bytes(n)) return cudaErrorInvalidValue;
  work = true;
  return cudaSuccess;
}
inline void scribble(void* d_temp, int64_t n) { std::memset(d_temp, 0xff, temp_bytes(n)); }

// A key's radix digits as cub orders them: signed keys with the sign bit flipped (two's
// complement in numeric order), then bits [begin_bit, end_bit).
template <typename K>
uint64_t radix_bits(K k, int begin_bit, int end_bit) {
  static_assert(std::is_integral_v<K>, "the fake sorts integer keys only");
  using U = std::make_unsigned_t<K>;
  U u = static_cast<U>(k);
  if constexpr (std::is_signed_v<K>) u ^= U(1) << (sizeof(K) * 8 - 1);
  const int width = end_bit - begin_bit;
  const uint64_t mask = width >= 64 ? ~uint64_t{0} : (uint64_t{1} << width) - 1;
  return (static_cast<uint64_t>(u) >> begin_bit) & mask;
}

}  // namespace emu_detail

struct DeviceRadixSort {
  // Stable sort of (keys_in, values_in) pairs by the keys' bits [begin_bit, end_bit).
  template <typename K, typename V, typename NumItemsT>
  static cudaError_t SortPairs(void* d_temp, size_t& bytes, const K* keys_in, K* keys_out, const V* values_in,
                               V* values_out, NumItemsT n, int begin_bit = 0, int end_bit = sizeof(K) * 8,
                               cudaStream_t stream = nullptr) {
    bool work;
    const cudaError_t e = emu_detail::take_temp(d_temp, bytes, static_cast<int64_t>(n), work);
    if (!work) return e;
    if (begin_bit < 0 || end_bit > static_cast<int>(sizeof(K) * 8) || begin_bit >= end_bit)
      return cudaErrorInvalidValue;
    return ::emu::submit(stream, [=] {
      emu_detail::scribble(d_temp, static_cast<int64_t>(n));
      std::vector<int64_t> idx(static_cast<size_t>(n));
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
        return emu_detail::radix_bits(keys_in[a], begin_bit, end_bit) <
               emu_detail::radix_bits(keys_in[b], begin_bit, end_bit);
      });
      std::vector<K> k(idx.size());
      std::vector<V> v(idx.size());
      for (size_t i = 0; i < idx.size(); ++i) k[i] = keys_in[idx[i]], v[i] = values_in[idx[i]];
      std::copy(k.begin(), k.end(), keys_out);
      std::copy(v.begin(), v.end(), values_out);
    });
  }
};

struct DeviceRunLengthEncode {
  // Runs of equal consecutive items: unique_out[r], counts_out[r] for r < *num_runs_out.
  template <typename InIt, typename UniqueIt, typename CountIt, typename NumRunsIt, typename NumItemsT>
  static cudaError_t Encode(void* d_temp, size_t& bytes, InIt in, UniqueIt unique_out, CountIt counts_out,
                            NumRunsIt num_runs_out, NumItemsT n, cudaStream_t stream = nullptr) {
    bool work;
    const cudaError_t e = emu_detail::take_temp(d_temp, bytes, static_cast<int64_t>(n), work);
    if (!work) return e;
    return ::emu::submit(stream, [=]() mutable {
      emu_detail::scribble(d_temp, static_cast<int64_t>(n));
      int64_t runs = 0;
      for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) {
        if (i == 0 || !(in[i] == in[i - 1])) {
          unique_out[runs] = in[i];
          counts_out[runs] = 0;
          ++runs;
        }
        counts_out[runs - 1] = counts_out[runs - 1] + 1;
      }
      *num_runs_out = static_cast<std::remove_reference_t<decltype(*num_runs_out)>>(runs);
    });
  }
};

struct DeviceScan {
  // out[i] = in[0] + ... + in[i-1], out[0] = 0 (in place allowed).
  template <typename InIt, typename OutIt, typename NumItemsT>
  static cudaError_t ExclusiveSum(void* d_temp, size_t& bytes, InIt in, OutIt out, NumItemsT n,
                                  cudaStream_t stream = nullptr) {
    bool work;
    const cudaError_t e = emu_detail::take_temp(d_temp, bytes, static_cast<int64_t>(n), work);
    if (!work) return e;
    return ::emu::submit(stream, [=]() mutable {
      emu_detail::scribble(d_temp, static_cast<int64_t>(n));
      using T = std::remove_cv_t<std::remove_reference_t<decltype(in[0])>>;
      T sum{};
      for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) {
        const T x = in[i];
        out[i] = sum;
        sum = sum + x;
      }
    });
  }
};

struct DeviceSelect {
  // The items whose flag is non-zero, in order, to out; their number to *num_selected.
  template <typename InIt, typename FlagIt, typename OutIt, typename NumSelectedIt, typename NumItemsT>
  static cudaError_t Flagged(void* d_temp, size_t& bytes, InIt in, FlagIt flags, OutIt out, NumSelectedIt num_selected,
                             NumItemsT n, cudaStream_t stream = nullptr) {
    bool work;
    const cudaError_t e = emu_detail::take_temp(d_temp, bytes, static_cast<int64_t>(n), work);
    if (!work) return e;
    return ::emu::submit(stream, [=]() mutable {
      emu_detail::scribble(d_temp, static_cast<int64_t>(n));
      int64_t k = 0;
      for (int64_t i = 0; i < static_cast<int64_t>(n); ++i)
        if (flags[i]) out[k++] = in[i];
      *num_selected = static_cast<std::remove_reference_t<decltype(*num_selected)>>(k);
    });
  }
};

}  // namespace cub
