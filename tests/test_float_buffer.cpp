// core/float_buffer: a fixed-size float array that starts zeroed; a large one's pages stay
// unwritten (not resident) until the caller writes them, which is what lets a low-precision model
// load without holding its fp32 size (tests/test_lowp_memory.sh checks that end to end).
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "core/float_buffer.h"

namespace jtok {
namespace {

// Pages of [p, p + bytes) that mincore reports resident (p page-aligned). Call it before reading
// the buffer: a read maps the shared zero page, which mincore counts.
size_t resident_pages(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)), n = (bytes + page - 1) / page;
  std::vector<unsigned char> v(n);
  EXPECT_EQ(mincore(const_cast<void*>(p), bytes, v.data()), 0);
  return static_cast<size_t>(std::count_if(v.begin(), v.end(), [](unsigned char c) { return c & 1; }));
}

TEST(FloatBuffer, LargeBufferIsZeroWithoutResidentPagesUntilWritten) {
  const size_t n = size_t(16) << 20;  // 64 MiB
  FloatBuffer b(n);
  ASSERT_EQ(b.size(), n);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  ASSERT_EQ(reinterpret_cast<uintptr_t>(b.data()) % page, 0u) << "a large buffer is a mapping of its own";
  EXPECT_EQ(resident_pages(b.data(), n * sizeof(float)), 0u);
  b[n / 2] = 3.0f;  // one page written (a transparent huge page at most: 2 MiB)
  const size_t after = resident_pages(b.data(), n * sizeof(float));
  EXPECT_GE(after, 1u);
  EXPECT_LE(after, (size_t(2) << 20) / page);
  EXPECT_EQ(std::count(b.begin(), b.end(), 0.0f), static_cast<std::ptrdiff_t>(n - 1));
  EXPECT_EQ(b[n / 2], 3.0f);
}

TEST(FloatBuffer, SmallAndEmptyBuffersAreZero) {
  for (size_t n : {size_t(0), size_t(1), size_t(1000), (size_t(1) << 18) - 1, size_t(1) << 18}) {  // either side of 1 MiB
    FloatBuffer b(n);
    EXPECT_EQ(b.size(), n);
    EXPECT_EQ(b.empty(), n == 0);
    EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](float x) { return x == 0.0f; })) << n;
  }
  FloatBuffer none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.data(), nullptr);
}

TEST(FloatBuffer, CopiesAreDeepMovesTransferAndEqualityComparesValues) {
  for (size_t n : {size_t(100), size_t(1) << 20}) {  // calloc and mmap
    FloatBuffer a(n);
    for (size_t i = 0; i < n; i += 7) a[i] = static_cast<float>(i);
    FloatBuffer c = a;
    EXPECT_EQ(c, a);
    EXPECT_NE(c.data(), a.data());
    c[0] = -1.0f;
    EXPECT_EQ(a[0], 0.0f);
    EXPECT_FALSE(c == a);
    const float* p = a.data();
    FloatBuffer m = std::move(a);
    EXPECT_EQ(m.data(), p);
    EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): a moved-from buffer is empty
    c = m;  // copy-assign over a buffer that had its own storage
    EXPECT_EQ(c, m);
    c = FloatBuffer(3);
    EXPECT_EQ(c.size(), 3u);
    EXPECT_FALSE(c == m);
  }
}

}  // namespace
}  // namespace jtok
