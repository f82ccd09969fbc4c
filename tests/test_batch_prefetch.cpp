// train/batch_prefetch.h: the same batches in the same order as the source, the next one read by the
// worker before it is asked for, a state that counts only the batches handed over (so a checkpoint
// taken with a batch read ahead resumes at that batch), restore, peek, a change of shape, and a
// failed read thrown where its batch is asked for, the state still the one before it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "train/batch_prefetch.h"

namespace jtok {
namespace {

// Batch k of shape (B, T): inputs k * 1000 + i, targets their negation; `fail_at` throws on that batch.
struct CountingSource {
  std::atomic<int64_t> pos{0}, reads{0};
  int64_t fail_at = -1;
  std::atomic<int> delay_ms{0};  // each read takes this long after it starts
  BatchSource source() {
    BatchSource s;
    s.next = [this](int32_t* x, int32_t* y, int64_t B, int64_t T) {
      ++reads;
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
      const int64_t k = pos;
      if (k == fail_at) throw std::runtime_error("batch " + std::to_string(k) + " is bad");
      for (int64_t i = 0; i < B * T; ++i) x[i] = static_cast<int32_t>(k * 1000 + i), y[i] = -x[i];
      pos = k + 1;
    };
    s.peek = [this](int64_t n, int32_t* x, int64_t B, int64_t T) {
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < B * T; ++i) x[j * B * T + i] = static_cast<int32_t>((pos + j) * 1000 + i);
    };
    s.state = [this] { return nlohmann::json{{"pos", pos.load()}}; };
    s.restore = [this](const nlohmann::json& j) { pos = j.at("pos").get<int64_t>(); };
    return s;
  }
};

// The batch number of (x, y), checking y against x.
int64_t batch_of(const std::vector<int32_t>& x, const std::vector<int32_t>& y) {
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], -x[i]);
  return x[0] / 1000;
}

// Waits (at most 10 s) until the source has served n reads.
bool reads_reach(const CountingSource& c, int64_t n) {
  for (int i = 0; i < 10000 && c.reads < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return c.reads >= n;
}

TEST(BatchPrefetch, SameBatchesReadAheadStateCountsHandedOver) {
  CountingSource c;
  BatchSource p = prefetching(c.source());
  std::vector<int32_t> x(6), y(6);
  for (int64_t k = 0; k < 5; ++k) {
    p.next(x.data(), y.data(), 2, 3);
    EXPECT_EQ(batch_of(x, y), k);
    EXPECT_EQ(x[5], k * 1000 + 5);
    ASSERT_TRUE(reads_reach(c, k + 2)) << "batch " << k + 1 << " not read ahead";
    EXPECT_EQ(p.state().at("pos").get<int64_t>(), k + 1);  // the batch read ahead is not counted
    EXPECT_EQ(c.pos, k + 2);
  }
}

TEST(BatchPrefetch, RestoreDropsTheBatchReadAhead) {
  CountingSource c;
  BatchSource p = prefetching(c.source());
  std::vector<int32_t> x(4), y(4);
  for (int k = 0; k < 3; ++k) p.next(x.data(), y.data(), 2, 2);
  const nlohmann::json saved = p.state();  // after batch 2, batch 3 read ahead
  p.next(x.data(), y.data(), 2, 2);
  EXPECT_EQ(batch_of(x, y), 3);
  p.restore(saved);
  p.next(x.data(), y.data(), 2, 2);
  EXPECT_EQ(batch_of(x, y), 3);
  p.restore(nlohmann::json{{"pos", 10}});
  EXPECT_EQ(p.state().at("pos").get<int64_t>(), 10);
  p.next(x.data(), y.data(), 2, 2);
  EXPECT_EQ(batch_of(x, y), 10);
}

TEST(BatchPrefetch, PeekKeepsTheBatchReadAheadAndAnotherShapeReadsAgain) {
  CountingSource c;
  BatchSource p = prefetching(c.source());
  std::vector<int32_t> x(4), y(4), ids(3 * 4);
  p.next(x.data(), y.data(), 2, 2);  // batch 0; batch 1 read ahead
  p.peek(3, ids.data(), 2, 2);
  EXPECT_EQ(ids[0], 1000);
  EXPECT_EQ(ids[4], 2000);
  EXPECT_EQ(ids[8], 3000);
  p.next(x.data(), y.data(), 2, 2);
  EXPECT_EQ(batch_of(x, y), 1);
  // Batch 2 was read ahead as (2, 2); asked as (1, 3) it is read again from the same position.
  std::vector<int32_t> x3(3), y3(3);
  p.next(x3.data(), y3.data(), 1, 3);
  EXPECT_EQ(batch_of(x3, y3), 2);
  EXPECT_EQ(x3[2], 2002);
  EXPECT_EQ(p.state().at("pos").get<int64_t>(), 3);
}

TEST(BatchPrefetch, AFailedReadThrowsWhereItsBatchIsAsked) {
  CountingSource c;
  c.fail_at = 2;
  BatchSource p = prefetching(c.source());
  std::vector<int32_t> x(4), y(4);
  p.next(x.data(), y.data(), 2, 2);
  p.next(x.data(), y.data(), 2, 2);  // batch 1 handed over; the read of batch 2 fails on the worker
  ASSERT_TRUE(reads_reach(c, 3));
  EXPECT_EQ(p.state().at("pos").get<int64_t>(), 2);  // a checkpoint now still saves the position before it
  EXPECT_THROW(
      {
        try {
          p.next(x.data(), y.data(), 2, 2);
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "batch 2 is bad");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_EQ(p.state().at("pos").get<int64_t>(), 2);
  c.fail_at = -1;  // the shard mended: the same batch read again
  p.next(x.data(), y.data(), 2, 2);
  EXPECT_EQ(batch_of(x, y), 2);
}

TEST(BatchPrefetch, ASourceWithoutPeekHasNoneAndEndingWithAReadInFlightJoins) {
  CountingSource c;
  BatchSource inner = c.source();
  inner.peek = nullptr;
  std::vector<int32_t> x(4), y(4);
  {
    BatchSource p = prefetching(inner);
    EXPECT_FALSE(p.peek);
    p.next(x.data(), y.data(), 2, 2);
    c.delay_ms = 200;
    p.next(x.data(), y.data(), 2, 2);
    ASSERT_TRUE(reads_reach(c, 3));  // batch 2's read has started
  }  // destroyed with the read in flight: it finishes first
  EXPECT_EQ(c.pos, 3);
  EXPECT_EQ(c.reads, 3);
}

}  // namespace
}  // namespace jtok
