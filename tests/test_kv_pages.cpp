// The paged KV cache's host bookkeeping (src/cuda/kv_pages.h): handles, page counts, the pool's
// accounting, fork's copy list and the errors' text; prefix blocks: pages shared by sequences and
// stored blocks, counted once in the pool and freed when their last holder goes, whatever the order.
// Plain C++: runs in every build.
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

// Every page is free or counted by exactly its holders (open sequences and stored blocks).
void expect_holders_counted(const KvPages& kv, int64_t n_pages) {
  std::vector<int32_t> holders(static_cast<size_t>(n_pages), 0);
  for (int64_t s = 0; s < kv.max_seqs(); ++s)
    if (kv.is_open(s))
      for (int32_t p : kv.pages(s)) holders[static_cast<size_t>(p)]++;
  for (int64_t b = 0; b < 64; ++b)
    if (kv.is_block(b))
      for (int32_t p : kv.block_pages(b)) holders[static_cast<size_t>(p)]++;
  int64_t held = 0;
  for (int32_t p = 0; p < n_pages; ++p) {
    EXPECT_EQ(kv.refs(p), holders[static_cast<size_t>(p)]) << "page " << p;
    held += holders[static_cast<size_t>(p)] > 0;
  }
  EXPECT_EQ(kv.free_pages(), n_pages - held);
}

TEST(KvPages, AKeptBlockSharesPagesUntilItsLastHolderGoes) {
  for (bool close_first : {true, false}) {
    KvPages kv(10, 16, 4);
    const int64_t a = kv.open(64);  // pages 0..3
    kv.advance(a, 40);
    const int64_t b0 = kv.keep(a, 0, 16), b1 = kv.keep(a, 16, 16);
    EXPECT_EQ(b0, 0);
    EXPECT_EQ(b1, 1);
    EXPECT_EQ(kv.block_pages(b0), (std::vector<int32_t>{0}));
    EXPECT_EQ(kv.block_pages(b1), (std::vector<int32_t>{1}));
    EXPECT_EQ(kv.refs(0), 2);
    EXPECT_EQ(kv.refs(2), 1);
    EXPECT_EQ(kv.free_pages(), 6);  // a block costs no page of its own
    EXPECT_EQ(kv.blocks(), 2);
    expect_holders_counted(kv, 10);
    if (close_first) {
      kv.close(a);  // the blocks keep pages 0 and 1
      EXPECT_EQ(kv.free_pages(), 8);
      expect_holders_counted(kv, 10);
      kv.drop(b1);
      kv.drop(b0);
    } else {
      kv.drop(b0);
      kv.drop(b1);
      EXPECT_EQ(kv.free_pages(), 6);  // a still holds them
      expect_holders_counted(kv, 10);
      kv.close(a);
    }
    EXPECT_EQ(kv.free_pages(), 10);
    EXPECT_EQ(kv.blocks(), 0);
    expect_holders_counted(kv, 10);
  }
}

TEST(KvPages, OpenFromMapsTheBlocksAndOwnsTheRest) {
  KvPages kv(12, 16, 4);
  const int64_t a = kv.open(48);  // pages 0..2
  kv.advance(a, 48);
  const int64_t b0 = kv.keep(a, 0, 16), b12 = kv.keep(a, 16, 32);  // a block of two pages
  kv.close(a);
  EXPECT_EQ(kv.free_pages(), 9);
  const int64_t c = kv.open_from({b0, b12}, 70);  // 48 mapped, pages for 49..69: 2 of its own
  EXPECT_EQ(kv.length(c), 48);
  EXPECT_EQ(kv.capacity(c), 70);
  EXPECT_EQ(kv.pages(c), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(kv.free_pages(), 7);
  EXPECT_EQ(kv.refs(1), 2);
  EXPECT_EQ(kv.refs(3), 1);
  const int64_t d = kv.open_from({b0}, 16);  // exactly the block: no page of its own
  EXPECT_EQ(kv.pages(d), (std::vector<int32_t>{0}));
  EXPECT_EQ(kv.refs(0), 3);
  EXPECT_EQ(kv.free_pages(), 7);
  EXPECT_THROW(kv.advance(d, 1), jtok::Error);
  expect_holders_counted(kv, 12);
  kv.drop(b0);
  kv.drop(b12);
  EXPECT_EQ(kv.free_pages(), 7);  // c and d still map them
  kv.close(c);
  EXPECT_EQ(kv.free_pages(), 11);
  kv.close(d);
  EXPECT_EQ(kv.free_pages(), 12);
  expect_holders_counted(kv, 12);
}

TEST(KvPages, ForkMapsSharedPagesAndCopiesItsOwn) {
  KvPages kv(20, 16, 6);
  const int64_t a = kv.open(64);
  kv.advance(a, 32);
  const int64_t b = kv.keep(a, 0, 32);  // pages 0, 1
  const int64_t c = kv.open_from({b}, 80);  // pages 0, 1 mapped; 4, 5, 6 its own
  kv.advance(c, 20);  // 52 positions: page 4 full, page 5 partly
  Copies copies;
  const int64_t f = kv.fork(c, 80, copies);
  EXPECT_EQ(kv.length(f), 52);
  ASSERT_EQ(kv.pages(f).size(), 5u);
  EXPECT_EQ(kv.pages(f)[0], 0);  // mapped, not copied
  EXPECT_EQ(kv.pages(f)[1], 1);
  EXPECT_EQ(copies, (Copies{{kv.pages(c)[2], kv.pages(f)[2]}, {kv.pages(c)[3], kv.pages(f)[3]}}));
  EXPECT_EQ(kv.refs(0), 4);  // a, b, c, f
  EXPECT_EQ(kv.refs(kv.pages(c)[2]), 1);
  EXPECT_EQ(kv.free_pages(), 20 - 4 - 3 - 3);
  expect_holders_counted(kv, 20);
  // a fork of a plain sequence still copies every page it wrote (a's pages 2, 3 are its own)
  kv.advance(a, 20);
  const int64_t g = kv.fork(a, 64, copies);
  EXPECT_EQ(kv.pages(g)[0], 0);
  EXPECT_EQ(copies.size(), 2u);
  expect_holders_counted(kv, 20);
  // Released in any order, every page comes back once.
  for (int64_t s : {c, a, g}) kv.close(s);
  kv.drop(b);
  EXPECT_EQ(kv.refs(0), 1);  // f alone
  kv.close(f);
  EXPECT_EQ(kv.free_pages(), 20);
  expect_holders_counted(kv, 20);
}

TEST(KvPages, KeepTakesOnlyWholeWrittenPages) {
  KvPages kv(10, 16, 4);
  const int64_t a = kv.open(64);
  kv.advance(a, 40);
  expect_has(error_of([&] { kv.keep(a, 8, 16); }), "[8, 24)");       // not page-aligned
  expect_has(error_of([&] { kv.keep(a, 0, 24); }), "whole pages of 16");  // a partial page
  expect_has(error_of([&] { kv.keep(a, 32, 16); }), "40 written");   // page 2 not written whole
  EXPECT_THROW(kv.keep(a, 0, 0), jtok::Error);
  EXPECT_THROW(kv.keep(3, 0, 16), jtok::Error);
  EXPECT_EQ(kv.blocks(), 0);
  expect_holders_counted(kv, 10);
  expect_has(error_of([&] { kv.drop(0); }), "block handle 0");
  expect_has(error_of([&] { kv.open_from({5}, 32); }), "block handle 5");
}

TEST(KvPages, FailedOpenFromTakesNothing) {
  KvPages kv(5, 16, 3);
  const int64_t a = kv.open(32);
  kv.advance(a, 32);
  const int64_t b = kv.keep(a, 0, 32);
  expect_has(error_of([&] { kv.open_from({b}, 31); }), "capacity of 31");
  const std::string e = error_of([&] { kv.open_from({b}, 32 + 4 * 16); });  // 4 own pages, 3 free
  expect_has(e, "need 4 pages");
  expect_has(e, "3 free");
  EXPECT_EQ(kv.refs(0), 2);
  EXPECT_EQ(kv.free_pages(), 3);
  const int64_t c = kv.open_from({b}, 32 + 3 * 16);  // exactly the rest
  EXPECT_EQ(kv.free_pages(), 0);
  kv.close(c);
  kv.open(1);
  kv.open(1);  // every handle taken
  expect_has(error_of([&] { kv.open_from({b}, 32); }), "all 3");
  expect_holders_counted(kv, 5);
}

}  // namespace
