// Token-id deduplication on the GPU, src/model/token_table.h's dedup_ids (RowBatch) exactly: the
// positions sorted by id, stably (cub's radix sort), the runs of equal ids found (run-length
// encode) and their offsets (exclusive scan). The token embedding's backward and JTok's gather and
// row-sparse gradients all walk it; every walk goes in position order within an id, so the sums it
// drives add in the CPU's order, but for an id with more than kHotChunk positions, summed a chunk of
// them at a time (cuda/hot_ids.cuh). identity_batch: the same walks without dedup (a row a position).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace jtok::cuda {

// Device arrays of one micro-batch's ids (N). Sizes are N bounds: only the first U entries (U+1
// for offsets) hold the result, U = *num_unique (on the device; copy it back only if the host needs
// it). Unused unique / offsets entries: N-valued offsets, unique entries unset.
struct DeviceRowBatch {
  int32_t* unique = nullptr;      // (N) sorted distinct ids, first U
  int32_t* inverse = nullptr;     // (N) position -> index into unique
  int32_t* offsets = nullptr;     // (N+1) positions of unique[u] are order[offsets[u]..offsets[u+1])
  int32_t* order = nullptr;       // (N) positions grouped by id, increasing within an id
  int32_t* num_unique = nullptr;  // (1) U
  // false: an identity batch (identity_batch: every position its own entry), whose unique entries
  // may name one row twice; a kernel that writes a row keyed by unique[u] then adds atomically.
  bool distinct = true;
  // A bound on U known on the host (0: none, the positions N), that kernels of a block an entry size
  // their grids by: the trainer counts the batch's distinct ids as it uploads them (~2,900 of a 16 x
  // 1024 batch), so ~13,000 blocks that would only read U and leave are never launched.
  int64_t max_unique = 0;
};

// Blocks of a kernel of a block an entry over a batch of N positions.
inline int64_t entry_blocks(const DeviceRowBatch& rb, int64_t N) {
  return rb.max_unique > 0 && rb.max_unique < N ? rb.max_unique : N;
}

// Some of a batch's unique entries: entry u where bit `bit` of bits[u] is set (bits null: every entry).
// JTok-M's (id, table) pairs a layer's routing chose (jtokm.h's ChosenTables, from jtokm_route; bit i: table i).
struct RowSubset {
  const uint32_t* bits = nullptr;  // (U) on the device
  int bit = 0;
};

// A frequent id's positions are summed in chunks on blocks of their own (cuda/hot_ids.cuh): the
// sorted positions (order's index) cut into chunks of kHotChunk; an id with more positions is hot.
constexpr int kHotChunk = 32;
inline int64_t hot_chunks(int64_t N) { return (N + kHotChunk - 1) / kHotChunk; }
// Floats of scratch those sums need for rows of W floats: a row a piece, two pieces a chunk.
inline int64_t hot_scratch_floats(int64_t N, int64_t W) { return 2 * hot_chunks(N) * W; }

// Bytes of scratch dedup_ids needs for N ids below V (cub's temporary storage and the sorted keys).
size_t dedup_scratch_bytes(int64_t N, int64_t V);

// ids (N) in [0, V) (checked on the host, where the batch was read) -> rb. scratch: dedup_scratch_bytes.
void dedup_ids(const DeviceRowBatch& rb, const int32_t* ids, int64_t N, int64_t V, void* scratch, size_t scratch_bytes,
               cudaStream_t stream);

// The batch without dedup (training's table_dedup false: the naive gather and scatter, a row per
// token position): unique = the ids as they come, inverse = order = offsets = positions 0..N,
// num_unique = count (N), distinct false. positions (N+1) and count (1) filled by fill_positions.
inline DeviceRowBatch identity_batch(int32_t* ids, int32_t* positions, int32_t* count) {
  return DeviceRowBatch{ids, positions, positions, positions, count, false};
}
// positions (N+1) = 0..N, count (1) = N.
void fill_positions(int32_t* positions, int32_t* count, int64_t N, cudaStream_t stream);

}  // namespace jtok::cuda
