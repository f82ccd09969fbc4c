// The CPU's RowBatch (src/model/token_table.h's dedup_ids) copied to the fake device, arrays sized as
// cuda::dedup_ids' (N, N, N + 1, N, 1): the token-table cases' device batch without dedup.cu.
#pragma once
#include <cstdint>
#include <vector>

#include "cuda/dedup.h"
#include "cuda_case.h"
#include "model/token_table.h"

namespace jtok::cuda_test {

struct DeviceBatch {
  DeviceBuffer<int32_t> unique, inverse, offsets, order, count;
  jtok::cuda::DeviceRowBatch rb;
  explicit DeviceBatch(const jtok::RowBatch& h)
      : unique(upload_exact(padded(h.unique, h.inverse.size()))), inverse(upload_exact(h.inverse)),
        offsets(upload_exact(padded(h.offsets, h.inverse.size() + 1))), order(upload_exact(h.order)),
        count(upload_exact(std::vector<int32_t>{static_cast<int32_t>(h.unique.size())})),
        rb{unique.get(), inverse.get(), offsets.get(), order.get(), count.get()} {}
  static std::vector<int32_t> padded(std::vector<int32_t> v, size_t n) {
    v.resize(n, -1);  // past U: what the kernels must not read
    return v;
  }
};

}  // namespace jtok::cuda_test
