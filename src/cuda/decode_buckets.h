// The shapes the GPU decoder launches a decode step at (issue 40: decode steps captured as CUDA
// graphs per batch-size bucket). A step of M sequences runs R = batch_bucket(M) rows, rows M..R-1
// dummies whose outputs are dropped, and its paged attention is launched for length_bucket(the
// longest row's positions) positions; eager and graph modes launch the same shapes, so they give the
// same bits, and a graph captured for a shape serves every step of that shape. Plain C++ (jtok_lib,
// every build).
//
// Why buckets of length as well as of batch: paged_attention's grid has ceil(max_len / chunk)
// chunks a (row, kv head), fixed once captured. Captured at the model's whole context (40,960
// positions for Qwen3: 160 chunks) a step of 16 rows with 8 kv heads would launch 20,480 blocks a
// layer to use a few dozen, blocks that return at once but still cost a launch slot each. Powers of
// two of chunks keep the waste under 2x and the graphs few: at most log2(context / chunk) + 1 length
// buckets, each captured only when a step first needs it.
#pragma once
#include <cstdint>
#include <vector>

namespace jtok::cuda {

// The smallest of 1, 2, 4, ... that is >= M, cut to max_batch (the last bucket is max_batch itself).
// M in 1..max_batch, else it fails naming both.
int64_t batch_bucket(int64_t M, int64_t max_batch);
// Every bucket batch_bucket gives for M = 1..max_batch, in increasing order.
std::vector<int64_t> batch_buckets(int64_t max_batch);
// max_len (1..context positions) rounded up to a power of two of chunks of `chunk` positions, cut to
// context: >= max_len, and the same for every max_len of one bucket. Out of range fails naming it.
int64_t length_bucket(int64_t max_len, int64_t context, int64_t chunk);

}  // namespace jtok::cuda
