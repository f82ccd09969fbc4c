// The GPU decoder's decode-step buckets (src/cuda/decode_buckets.h): the batch bucket of every M and
// the length bucket of every length hold the step (>= M, >= max_len), never pass max_batch or the
// context, and take few values (what bounds the CUDA graphs a decoder captures). Plain C++: runs here.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "cuda/decode_buckets.h"
#include "error_test_util.h"

namespace {

using jtok::cuda::batch_bucket;
using jtok::cuda::batch_buckets;
using jtok::cuda::length_bucket;

TEST(DecodeBuckets, BatchBucketsArePowersOfTwoUpToMaxBatch) {
  EXPECT_EQ(batch_buckets(16), (std::vector<int64_t>{1, 2, 4, 8, 16}));
  EXPECT_EQ(batch_buckets(12), (std::vector<int64_t>{1, 2, 4, 8, 12}));
  EXPECT_EQ(batch_buckets(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(batch_bucket(3, 16), 4);
  EXPECT_EQ(batch_bucket(9, 12), 12);
  EXPECT_EQ(batch_bucket(8, 12), 8);
  for (int64_t max_batch : {1, 3, 5, 16, 48}) {
    for (int64_t M = 1; M <= max_batch; ++M) {
      const int64_t b = batch_bucket(M, max_batch);
      EXPECT_GE(b, M);
      EXPECT_LE(b, max_batch);
      EXPECT_TRUE(b == max_batch || (b & (b - 1)) == 0) << b;
      EXPECT_LT(b, 2 * M) << "M " << M << ": at most M - 1 dummy rows";
    }
  }
  jtok::testing::expect_error([] { batch_bucket(17, 16); }, {"17 sequences", "max_batch 16"});
  jtok::testing::expect_error([] { batch_bucket(0, 16); }, {"0 sequences"});
}

TEST(DecodeBuckets, LengthBucketsArePowersOfTwoOfChunksUpToTheContext) {
  EXPECT_EQ(length_bucket(1, 40960, 256), 256);
  EXPECT_EQ(length_bucket(256, 40960, 256), 256);
  EXPECT_EQ(length_bucket(257, 40960, 256), 512);
  EXPECT_EQ(length_bucket(640, 40960, 256), 1024);
  EXPECT_EQ(length_bucket(40000, 40960, 256), 40960);  // 256 chunks of 256, cut to the context
  EXPECT_EQ(length_bucket(30, 64, 256), 64);            // a context shorter than a chunk
  std::set<int64_t> seen;
  for (int64_t len = 1; len <= 40960; ++len) {
    const int64_t b = length_bucket(len, 40960, 256);
    EXPECT_GE(b, len);
    EXPECT_LE(b, 40960);
    if (len > 256) {
      EXPECT_LT(b, 2 * len) << len;  // at most twice the chunks a row needs
    }
    seen.insert(b);
  }
  EXPECT_EQ(seen.size(), 9u);  // 256, 512, ..., 32768 and the context: the graphs a batch bucket can need
  jtok::testing::expect_error([] { length_bucket(65, 64, 256); }, {"65 positions", "64"});
}

}  // namespace
