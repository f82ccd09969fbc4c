// The paged KV cache's host bookkeeping (src/cuda/kv_pages.h): handles, page counts, the pool's
// accounting, fork's copy list and the errors' text. Plain C++: runs in every build.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "cuda/kv_pages.h"

namespace {

using jtok::cuda::KvPages;
using Copies = std::vector<std::pair<int32_t, int32_t>>;

// The message of the jtok::Error f throws ("" and a test failure when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const jtok::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no jtok::Error thrown";
  return "";
}

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

TEST(KvPages, PagesForRoundsUp) {
  const KvPages kv(10, 16, 4);
  EXPECT_EQ(kv.pages_for(0), 0);
  EXPECT_EQ(kv.pages_for(1), 1);
  EXPECT_EQ(kv.pages_for(15), 1);
  EXPECT_EQ(kv.pages_for(16), 1);
  EXPECT_EQ(kv.pages_for(17), 2);
  EXPECT_EQ(kv.pages_for(32), 2);
  EXPECT_EQ(kv.pages_for(33), 3);
  EXPECT_EQ(kv.page_tokens(), 16);
  EXPECT_EQ(kv.max_seqs(), 4);
  EXPECT_THROW(kv.pages_for(-1), jtok::Error);
}

TEST(KvPages, OpenTakesLowestHandleAndLowestPages) {
  KvPages kv(10, 16, 3);
  EXPECT_EQ(kv.free_pages(), 10);
  const int64_t a = kv.open(17);  // 2 pages
  EXPECT_EQ(a, 0);
  EXPECT_EQ(kv.pages(a), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(kv.length(a), 0);
  EXPECT_EQ(kv.capacity(a), 17);
  EXPECT_TRUE(kv.is_open(a));
  const int64_t b = kv.open(48);  // 3 pages
  EXPECT_EQ(b, 1);
  EXPECT_EQ(kv.pages(b), (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(kv.free_pages(), 5);
  kv.close(a);
  EXPECT_FALSE(kv.is_open(a));
  EXPECT_EQ(kv.free_pages(), 7);
  // Handle 0 is free again and comes first; pages 0, 1 are the lowest free ones again.
  const int64_t c = kv.open(1);
  EXPECT_EQ(c, 0);
  EXPECT_EQ(kv.pages(c), (std::vector<int32_t>{0}));
  const int64_t d = kv.open(32);
  EXPECT_EQ(d, 2);
  EXPECT_EQ(kv.pages(d), (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(kv.free_pages(), 4);
}

TEST(KvPages, EmptyCapacityTakesNoPages) {
  KvPages kv(2, 16, 2);
  const int64_t a = kv.open(0);
  EXPECT_TRUE(kv.pages(a).empty());
  EXPECT_EQ(kv.free_pages(), 2);
  EXPECT_THROW(kv.advance(a, 1), jtok::Error);
  kv.advance(a, 0);
  EXPECT_EQ(kv.length(a), 0);
}

TEST(KvPages, EveryPageHeldOnceUntilClosed) {
  KvPages kv(20, 4, 8);
  std::vector<int64_t> open;
  for (int64_t cap : {5, 1, 9, 4, 13}) open.push_back(kv.open(cap));
  kv.close(open[1]);
  kv.close(open[3]);
  open.push_back(kv.open(7));
  std::set<int32_t> held;
  int64_t n_held = 0;
  for (int64_t s = 0; s < kv.max_seqs(); ++s) {
    if (!kv.is_open(s)) continue;
    EXPECT_EQ(static_cast<int64_t>(kv.pages(s).size()), kv.pages_for(kv.capacity(s)));
    for (int32_t p : kv.pages(s)) {
      EXPECT_GE(p, 0);
      EXPECT_LT(p, 20);
      held.insert(p);
      ++n_held;
    }
  }
  EXPECT_EQ(static_cast<int64_t>(held.size()), n_held) << "a page is held by two sequences";
  EXPECT_EQ(kv.free_pages(), 20 - n_held);
  for (int64_t s = 0; s < kv.max_seqs(); ++s)
    if (kv.is_open(s)) kv.close(s);
  EXPECT_EQ(kv.free_pages(), 20);
  EXPECT_EQ(kv.pages(kv.open(80)).size(), 20u);  // the whole pool again, in one sequence
}

TEST(KvPages, AdvanceStopsAtCapacity) {
  KvPages kv(10, 16, 2);
  const int64_t a = kv.open(20);
  kv.advance(a, 19);
  kv.advance(a, 1);
  EXPECT_EQ(kv.length(a), 20);
  const std::string e = error_of([&] { kv.advance(a, 1); });
  expect_has(e, "20 positions");
  expect_has(e, "advance by 1");
  expect_has(e, "capacity 20");
  EXPECT_EQ(kv.length(a), 20);
  EXPECT_THROW(kv.advance(a, -1), jtok::Error);
}

TEST(KvPages, ForkCopiesThePagesHoldingPositions) {
  KvPages kv(40, 16, 8);
  const int64_t spacer = kv.open(16);  // the parent's pages do not start at 0
  const int64_t a = kv.open(100);      // 7 pages: 1..7
  Copies copies{{99, 99}};
  // Empty: no copies (and the stale entry is gone), length 0.
  const int64_t e = kv.fork(a, 10, copies);
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(kv.length(e), 0);
  EXPECT_EQ(kv.capacity(e), 10);
  // 33 positions: pages 0, 1 full and position 32 alone on page 2 (the partial last page copied).
  kv.advance(a, 33);
  const int64_t f = kv.fork(a, 40, copies);
  EXPECT_EQ(kv.length(f), 33);
  EXPECT_EQ(kv.capacity(f), 40);
  ASSERT_EQ(copies.size(), 3u);
  for (size_t i = 0; i < copies.size(); ++i) {
    EXPECT_EQ(copies[i].first, kv.pages(a)[i]);
    EXPECT_EQ(copies[i].second, kv.pages(f)[i]);
  }
  EXPECT_EQ(kv.pages(f).size(), 3u);
  // Exactly a page boundary: 32 positions take 2 pages, no third.
  const int64_t g = kv.open(64);
  kv.advance(g, 32);
  kv.fork(g, 64, copies);
  EXPECT_EQ(copies.size(), 2u);
  // The parent is unchanged and both advance independently.
  EXPECT_EQ(kv.length(a), 33);
  kv.advance(f, 7);
  EXPECT_EQ(kv.length(a), 33);
  EXPECT_EQ(kv.length(f), 40);
  kv.close(spacer);
}

TEST(KvPages, ForkSmallerThanTheParentFails) {
  KvPages kv(10, 16, 4);
  const int64_t a = kv.open(40);
  kv.advance(a, 30);
  Copies copies;
  const std::string e = error_of([&] { kv.fork(a, 29, copies); });
  expect_has(e, "30 positions");
  expect_has(e, "capacity of 29");
  EXPECT_EQ(kv.free_pages(), 7);  // nothing taken
}

TEST(KvPages, PoolExhaustionNamesPositionsAndPages) {
  KvPages kv(5, 16, 4);
  const int64_t a = kv.open(48);  // 3 pages
  const std::string e = error_of([&] { kv.open(33); });
  expect_has(e, "33 positions");
  expect_has(e, "need 3 pages");
  expect_has(e, "2 free");
  EXPECT_EQ(kv.free_pages(), 2);  // a failed open takes nothing
  EXPECT_FALSE(kv.is_open(1));
  kv.advance(a, 40);
  Copies copies;
  const std::string f = error_of([&] { kv.fork(a, 48, copies); });
  expect_has(f, "48 positions");
  expect_has(f, "2 free");
  EXPECT_EQ(kv.open(32), 1);  // exactly the rest fits
  EXPECT_EQ(kv.free_pages(), 0);
}

TEST(KvPages, HandlesRunOut) {
  KvPages kv(100, 16, 2);
  kv.open(1);
  kv.open(1);
  const std::string e = error_of([&] { kv.open(1); });
  expect_has(e, "all 2");
  EXPECT_EQ(kv.free_pages(), 98);
}

TEST(KvPages, UnknownHandlesAreNamed) {
  KvPages kv(10, 16, 3);
  const int64_t a = kv.open(16);
  expect_has(error_of([&] { kv.close(2); }), "handle 2");
  expect_has(error_of([&] { kv.close(7); }), "handle 7");
  expect_has(error_of([&] { kv.close(-1); }), "handle -1");
  expect_has(error_of([&] { kv.length(1); }), "handle 1");
  expect_has(error_of([&] { kv.pages(5); }), "handle 5");
  Copies copies;
  expect_has(error_of([&] { kv.fork(1, 16, copies); }), "handle 1");
  kv.close(a);
  expect_has(error_of([&] { kv.close(a); }), "handle 0");  // closed twice
  EXPECT_FALSE(kv.is_open(-3));
  EXPECT_FALSE(kv.is_open(3));
  EXPECT_EQ(kv.free_pages(), 10);
}

TEST(KvPages, BadPoolsAreRefused) {
  EXPECT_THROW(KvPages(10, 0, 2), jtok::Error);
  EXPECT_THROW(KvPages(10, 16, 0), jtok::Error);
  EXPECT_THROW(KvPages(-1, 16, 2), jtok::Error);
  EXPECT_THROW(KvPages(int64_t{1} << 32, 16, 2), jtok::Error);
}

}  // namespace
