// A frequent id's positions summed on many blocks (included by .cu files only). The walks of dedup.h
// add an id's positions in order on one block an id, so the commonest id's block is the kernel's
// tail: a 16 x 1024 batch of our GPT-2 shards holds ~1,260 positions of its commonest id and ~5 of
// the median one. So the sorted positions (order's index) are cut into chunks of kHotChunk (dedup.h),
// and a hot id (more than kHotChunk positions) is summed first a piece at a time, a piece being its
// positions within one chunk, each piece from zero in position order on a block of its own; the id's
// own block then adds its pieces' sums in chunk order. A chunk holds at most two hot pieces: the
// one holding its first position (piece 2c) and the one holding its last, if another id's (2c + 1),
// because a hot id cannot fit inside a chunk. An id with at most kHotChunk positions is summed
// position by position as before: the CPU's order of adds, the CPU's bits; a hot id's sum is within
// fp32 rounding of the CPU's, and the same bits every run.
//   rb = dedup_ids(ids) over N positions; pieces: 2 hot_chunks(N), piece q's sums at row q of scratch.
#pragma once
#include "cuda/dedup.h"

namespace jtok::cuda {

struct PositionRange {
  int lo = 0, hi = 0;  // sorted positions order[lo .. hi)
  __device__ int size() const { return hi - lo; }
};

__device__ __forceinline__ bool is_hot(int lo, int hi) { return hi - lo > kHotChunk; }

// Piece q of a batch (chunk q / 2; q odd: the id holding the chunk's last position): empty where that
// id is not hot, and for an odd q whose id also holds the chunk's first position (piece q - 1's).
__device__ __forceinline__ PositionRange hot_piece(const DeviceRowBatch& rb, int64_t N, int64_t q) {
  const int a = static_cast<int>(q / 2 * kHotChunk), b = static_cast<int>(min(N, int64_t{a} + kHotChunk));
  const int u = rb.inverse[rb.order[q % 2 == 0 ? a : b - 1]];
  const int lo = rb.offsets[u], hi = rb.offsets[u + 1];
  if (!rb.distinct || !is_hot(lo, hi) || (q % 2 == 1 && lo <= a)) return {};
  return {max(lo, a), min(hi, b)};
}

// acc + the pieces of hot entry [lo, hi), added in chunk order: piece q's value at hot[q * W] (the
// caller offsets hot to its column). Its chunks are c = lo / kHotChunk .. (hi - 1) / kHotChunk; chunk
// c's piece is 2c where the id holds the chunk's first position, else 2c + 1.
__device__ __forceinline__ float add_hot_pieces_in_order(float acc, const float* hot, int lo, int hi, int64_t W) {
  for (int64_t c = lo / kHotChunk; c <= (hi - 1) / kHotChunk; ++c)
    acc += hot[(2 * c + (c * kHotChunk >= lo ? 0 : 1)) * W];
  return acc;
}

// order[r.lo .. r.hi) (at most kHotChunk) into pos, for the whole block; ends with a barrier.
__device__ __forceinline__ void stage_positions(int32_t* pos, const int32_t* order, PositionRange r) {
  if (static_cast<int>(threadIdx.x) < r.size()) pos[threadIdx.x] = order[r.lo + threadIdx.x];
  __syncthreads();
}

// Block q (a launch of 2 hot_chunks(N) blocks): hot row q (W) = the sum over piece q's positions n,
// from zero in position order, of term(n, j) for column j; nothing where the piece is empty.
template <typename Term>
__device__ void sum_hot_piece(float* hot, const DeviceRowBatch& rb, int64_t N, int64_t W, Term term) {
  __shared__ int32_t pos[kHotChunk];
  const PositionRange r = hot_piece(rb, N, blockIdx.x);
  if (r.size() == 0) return;
  stage_positions(pos, rb.order, r);
  for (int64_t j = threadIdx.x; j < W; j += blockDim.x) {
    float acc = 0.0f;
#pragma unroll 8
    for (int t = 0; t < r.size(); ++t) acc += term(static_cast<int64_t>(pos[t]), j);
    hot[blockIdx.x * W + j] = acc;
  }
}

}  // namespace jtok::cuda
