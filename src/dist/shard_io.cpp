#include "dist/shard_io.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"

namespace jtok::dist {

void read_owned_rows(const StIndex& idx, const std::string& name, const TokenTable& shard, float* dst) {
  const int64_t V = shard.id_count, d = shard.dim, block = 4096;
  auto it = idx.tensors.find(name);
  if (it == idx.tensors.end()) fail(idx.path, ": missing tensor ", name);
  if (it->second.dtype != "F32" || it->second.shape != std::vector<int64_t>{V, d})
    fail(idx.path, ": tensor ", name, " is not F32 of shape [", V, ", ", d, "]");
  std::vector<float> buf(static_cast<size_t>(std::min(block, V) * d));
  for (int64_t lo = 0; lo < V; lo += block) {
    const int64_t hi = std::min(V, lo + block);
    read_tensor_range(idx, name, static_cast<uint64_t>(lo * d) * sizeof(float),
                      static_cast<uint64_t>((hi - lo) * d) * sizeof(float), buf.data());
    for (int64_t g = lo; g < hi; ++g)
      if (shard.holds(g)) std::memcpy(dst + shard.row_of(g) * d, buf.data() + (g - lo) * d, sizeof(float) * d);
  }
}

void gather_rows_to_root(const RowOwner& own, const TokenTable& shard, const float* rows, float* whole) {
  const int P = world_size(), me = rank();
  const int64_t d = shard.dim, fb = static_cast<int64_t>(sizeof(float));
  std::vector<int64_t> sc(static_cast<size_t>(P), 0), so(static_cast<size_t>(P), 0), rc(static_cast<size_t>(P), 0);
  sc[0] = shard.rows * d * fb;
  if (me == 0)
    for (int r = 0; r < P; ++r) rc[static_cast<size_t>(r)] = own.rows_on(r) * d * fb;
  const std::vector<int64_t> ro = prefix_offsets(rc);
  std::vector<float> all(static_cast<size_t>((ro.back() + rc.back()) / fb));
  alltoallv(rows, sc, so, all.data(), rc, ro);
  if (me != 0) return;
  JTOK_CHECK(whole != nullptr, "gather_rows_to_root: rank 0 without a destination");
  for (int r = 0; r < P; ++r) {
    const float* base = all.data() + ro[static_cast<size_t>(r)] / fb;
    for (int64_t i = 0; i < own.rows_on(r); ++i) std::memcpy(whole + own.global(r, i) * d, base + i * d, sizeof(float) * d);
  }
}

}  // namespace jtok::dist
