// int4 token tables (ops/int4_rows.h, `jtok export --table-dtype int4`): the round trip of every
// value stays within half a step (scale / 2) of its fp32 value, the row's largest magnitude lands on
// level +-7, the packing is the documented one (element 2i in the low half of byte i, odd rows end in
// a zero high half), the fast decoding equals the plain reference bit for bit, a non-finite value is
// refused naming its row, and an odd-dimension table reads the same from RAM, a view and the
// token-major disk store. (tests/test_row_store.cpp runs the gathers over every storage, int4 RAM
// and int4 disk among them.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "op_test_util.h"
#include "core/error.h"
#include "store/table_store.h"
#include "train/store_export.h"
#include "model/token_table.h"
#include "ops/int4_rows.h"

using namespace jtok;
using jtok::testing::randn;

TEST(Int4Rows, RoundTripWithinHalfAStepAndTheMaximumOnTheLastLevel) {
  for (int64_t n : {1, 2, 7, 32, 33, 129}) {  // odd and even, shorter and longer than a vector
    SCOPED_TRACE(n);
    std::vector<float> x = randn(static_cast<size_t>(n), 40 + static_cast<uint64_t>(n), 0.3f);
    x[static_cast<size_t>(n / 2)] = -1.7f;  // the largest magnitude is negative: it must decode to -7 steps
    std::vector<uint8_t> q(static_cast<size_t>((n + 1) / 2), 0xAA);
    const float s = quantize_int4_row(q.data(), x.data(), n);
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    EXPECT_EQ(s, amax / 7.0f);
    std::vector<float> fast(static_cast<size_t>(n));
    dequantize_int4_row(fast.data(), q.data(), s, n);
    double worst = 0;
    for (int64_t j = 0; j < n; ++j) {
      const float ref = int4_element(q.data(), s, j);
      ASSERT_EQ(std::memcmp(&fast[static_cast<size_t>(j)], &ref, 4), 0) << "element " << j << ": fast != reference";
      const double err = std::fabs(static_cast<double>(fast[static_cast<size_t>(j)]) - x[static_cast<size_t>(j)]);
      ASSERT_LE(err, s / 2.0 * (1 + 1e-6)) << "element " << j;
      worst = std::max(worst, err / s);
    }
    EXPECT_EQ(fast[static_cast<size_t>(n / 2)], -7.0f * s);
    if (n >= 32) {
      EXPECT_GT(worst, 0.4);  // rounding happened: the bound is not vacuous
    }
    if (n % 2) {
      EXPECT_EQ(q.back() >> 4, 0) << "an odd row's last high half";
    }
  }
}

TEST(Int4Rows, PackingIsLowHalfFirstTwosComplement) {
  const float x[5] = {7.0f, -7.0f, 1.0f, -3.0f, 2.0f};  // scale 1: the levels are the values
  uint8_t q[3] = {0xff, 0xff, 0xff};
  EXPECT_EQ(quantize_int4_row(q, x, 5), 1.0f);
  EXPECT_EQ(q[0], 0x97);  // 7 low, -7 (0x9) high
  EXPECT_EQ(q[1], 0xD1);  // 1 low, -3 (0xD) high
  EXPECT_EQ(q[2], 0x02);  // 2 low, the odd row's padding 0 high
  const uint8_t eight = 0x08;  // -8: never written, decoded as its two's complement value
  EXPECT_EQ(int4_element(&eight, 0.5f, 0), -4.0f);
  const float zeros[3] = {0, 0, 0};
  EXPECT_EQ(quantize_int4_row(q, zeros, 3), 0.0f);
  EXPECT_EQ(q[0] | q[1], 0);
}

TEST(Int4Rows, NonFiniteValueIsRefusedNamingTheRow) {
  std::vector<float> x = randn(4 * 9, 3);
  x[2 * 9 + 5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> q(4 * 5);
  std::vector<float> s(4);
  try {
    quantize_int4_rows(q.data(), s.data(), x.data(), 4, 9);
    ADD_FAILURE() << "a NaN was quantised";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 2"), std::string::npos) << e.what();
  }
}

// An odd dimension end to end: quantize_table, a view of the same bytes (a mapped file), and the
// disk store, gathered alike; sizes as documented; int4 refuses writes and the f32 accessors.
TEST(Int4Rows, OddDimensionTableReadsAlikeFromRamViewAndDisk) {
  const int64_t V = 50, d = 37;
  const std::vector<float> x = randn(static_cast<size_t>(V * d), 9, 0.5f);
  const TokenTable q = quantize_table(TokenTable::in_ram(V, d, x), Dtype::int4);
  EXPECT_EQ(q.row_stride_bytes(), 19);
  EXPECT_EQ(q.storage_bytes(), V * 19 + V * 4);
  auto bytes = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(q.raw_row(0)),
                                                      static_cast<const uint8_t*>(q.raw_row(0)) + V * 19);
  auto scales = std::make_shared<std::vector<float>>(q.scales(), q.scales() + V);
  auto both = std::make_shared<std::pair<decltype(bytes), decltype(scales)>>(bytes, scales);
  const TokenTable v = TokenTable::view(V, d, Dtype::int4, bytes->data(), scales->data(), both);
  const std::string dir = ::testing::TempDir() + "int4_odd_" + std::to_string(::getpid());
  write_table_store(dir, {q, q}, {"a", "b"});  // two tables: the second starts past an odd-length row and its scale
  const auto store = TableStore::open(dir, 4096);
  EXPECT_EQ(store->tables()[1].offset, 24);  // 19 bytes + 4 of scale, 4-byte aligned
  const TokenTable disk = TokenTable::on_disk(disk_rows(store, 1));
  std::vector<int32_t> ids;
  for (int32_t i = V - 1; i >= 0; i -= 3) ids.push_back(i);
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<float> a(static_cast<size_t>(n * d)), b(a.size()), c(a.size()), ref(a.size());
  gather_rows(a.data(), q, ids.data(), n);
  gather_rows(b.data(), v, ids.data(), n);
  gather_rows(c.data(), disk, ids.data(), n);
  gather_rows_ref(ref.data(), disk, ids.data(), n);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  EXPECT_EQ(0, std::memcmp(a.data(), ref.data(), sizeof(float) * a.size()));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j)
      ASSERT_LE(std::fabs(a[static_cast<size_t>(i * d + j)] - x[static_cast<size_t>(ids[i] * d + j)]),
                q.scales()[ids[i]] / 2 * (1 + 1e-6));
  EXPECT_TRUE(q.read_only());
  TokenTable w = q;
  EXPECT_THROW(w.mutable_data(), Error);
  EXPECT_THROW((void)q.data(), Error);
  EXPECT_THROW(dtype_bytes(Dtype::int4), Error);  // no whole byte an element: sizes come from dtype_row_bytes
  EXPECT_EQ(dtype_row_bytes(Dtype::int4, 37), 19);
  EXPECT_EQ(parse_dtype("int4", "--table-dtype", {Dtype::f32, Dtype::int4}), Dtype::int4);
  EXPECT_THROW(parse_dtype("int4", "--weight-dtype"), Error);  // weights: f32, bf16, int8 only
}
