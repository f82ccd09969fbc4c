// The GPU decoder's decode-step buckets (src/cuda/decode_buckets.h).
#include "cuda/decode_buckets.h"

#include <algorithm>

#include "core/error.h"

namespace jtok::cuda {

int64_t batch_bucket(int64_t M, int64_t max_batch) {
  if (max_batch < 1 || M < 1 || M > max_batch)
    fail("decode buckets: a step of ", M, " sequences (1 to max_batch ", max_batch, ")");
  int64_t b = 1;
  while (b < M) b *= 2;
  return std::min(b, max_batch);
}

std::vector<int64_t> batch_buckets(int64_t max_batch) {
  std::vector<int64_t> out;
  for (int64_t M = 1; M <= max_batch; ++M) {
    const int64_t b = batch_bucket(M, max_batch);
    if (out.empty() || out.back() != b) out.push_back(b);
  }
  return out;
}

int64_t length_bucket(int64_t max_len, int64_t context, int64_t chunk) {
  if (chunk < 1 || context < 1 || max_len < 1 || max_len > context)
    fail("decode buckets: ", max_len, " positions (1 to the context's ", context, "; chunks of ", chunk, ")");
  const int64_t chunks = (max_len + chunk - 1) / chunk;
  int64_t b = 1;
  while (b < chunks) b *= 2;
  return std::min(b * chunk, context);
}

}  // namespace jtok::cuda
