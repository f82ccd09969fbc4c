// The device RowBatch of ids (N) below V (cuda/dedup.h): its arrays, and dedup_ids run on them on
// the default stream. The token-table cases' batch (test_cuda_dedup.cpp, test_cuda_jtok.cpp,
// test_cuda_jtokm.cpp, emu/emu_dedup_test.cpp).
#pragma once
#include <cstdint>

#include "cuda/dedup.h"
#include "cuda_case.h"

namespace jtok::cuda_test {

struct DeviceDedup {
  DeviceBuffer<int32_t> unique, inverse, offsets, order, count;
  DeviceBuffer<char> scratch;
  jtok::cuda::DeviceRowBatch rb;
  DeviceDedup(const DeviceBuffer<int32_t>& ids, int64_t N, int64_t V)
      : unique(N), inverse(N), offsets(N + 1), order(N), count(1), scratch(jtok::cuda::dedup_scratch_bytes(N, V)),
        rb{unique.get(), inverse.get(), offsets.get(), order.get(), count.get()} {
    jtok::cuda::dedup_ids(rb, ids.get(), N, V, scratch.get(), scratch.n, nullptr);
  }
};

}  // namespace jtok::cuda_test
