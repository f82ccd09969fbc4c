// The one row store (model/token_table.h), in the manner of ggml's test-backend-ops: one case
// struct, run over every storage a token table has (RAM, a read-only view, bf16, int8, int4, a
// one-rank shard, each rank's shard of a two-rank split by id mod P and by contiguous ranges, the
// token-major disk store in f32 / bf16 / int8 / int4 with a cache smaller than the table), gather
// and scatter against their plain references:
//   - gather_rows equals gather_rows_ref bit for bit, and the whole f32 table's rows within the
//     storage's quantisation bound; the sync hook sees (table, the id's row) once per id;
//   - scatter_rows equals scatter_rows_ref bit for bit and gathers back exactly on writable
//     storage; read-only storage refuses it;
//   - an id the storage does not hold is refused, naming the id.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "op_test_util.h"
#include "temp_dir.h"
#include "core/error.h"
#include "dist/embedding_parallel.h"
#include "store/table_store.h"
#include "train/store_export.h"
#include "model/token_table.h"

using namespace jtok;
using jtok::testing::randn;

namespace {

constexpr int64_t V = 97, d = 24;  // V odd: a two-rank split is uneven

struct StorageCase {
  std::string name;
  std::function<TokenTable(const std::vector<float>& whole)> make;
  bool writable;
  // |gathered - whole| <= bound(row's max |x|) per element.
  std::function<double(double row_max)> bound;
};

TokenTable shard_of(const std::vector<float>& whole, const dist::RowOwner& own, int rank) {
  TokenTable t = dist::make_shard(own, rank, 1, d, {whole.data()}).tables[0];
  EXPECT_EQ(t.rows, own.rows_on(rank));
  return t;
}

// A store of the one table (quantized to dt) in a fresh directory, with a cache of two pages: the
// gathers below read every id, so blocks are evicted and read again.
TokenTable on_disk(const std::vector<float>& whole, Dtype dt) {
  const std::string dir = jtok::testing::fresh_temp_dir("row_store");
  const TokenTable ram = TokenTable::in_ram(V, d, whole);
  write_table_store(dir, {dt == Dtype::f32 ? ram : quantize_table(ram, dt)}, {"t"});
  return TokenTable::on_disk(disk_rows(TableStore::open(dir, 2 * 4096), 0));
}

std::vector<StorageCase> storages() {
  auto exact = [](double) { return 0.0; };
  std::vector<StorageCase> c = {
      {"ram", [](const std::vector<float>& w) { return TokenTable::in_ram(V, d, w); }, true, exact},
      {"view",
       [](const std::vector<float>& w) {
         auto owner = std::make_shared<std::vector<float>>(w);
         return TokenTable::view(V, d, owner->data(), owner);
       },
       false, exact},
      {"bf16", [](const std::vector<float>& w) { return quantize_table(TokenTable::in_ram(V, d, w), Dtype::bf16); },
       false, [](double m) { return m * std::ldexp(1.0, -8); }},
      {"int8", [](const std::vector<float>& w) { return quantize_table(TokenTable::in_ram(V, d, w), Dtype::int8); },
       false, [](double m) { return m / 127.0 * 0.5 + 1e-6 * m; }},
      {"int4", [](const std::vector<float>& w) { return quantize_table(TokenTable::in_ram(V, d, w), Dtype::int4); },
       false, [](double m) { return m / 7.0 * 0.5 + 1e-6 * m; }},
      {"shard P=1", [](const std::vector<float>& w) { return shard_of(w, {V, 1}, 0); }, true, exact},
      {"disk f32", [](const std::vector<float>& w) { return on_disk(w, Dtype::f32); }, false, exact},
      {"disk bf16", [](const std::vector<float>& w) { return on_disk(w, Dtype::bf16); }, false,
       [](double m) { return m * std::ldexp(1.0, -8); }},
      {"disk int8", [](const std::vector<float>& w) { return on_disk(w, Dtype::int8); }, false,
       [](double m) { return m / 127.0 * 0.5 + 1e-6 * m; }},
      {"disk int4", [](const std::vector<float>& w) { return on_disk(w, Dtype::int4); }, false,
       [](double m) { return m / 7.0 * 0.5 + 1e-6 * m; }},
  };
  for (auto kind : {dist::RowOwner::kModP, dist::RowOwner::kContiguous})
    for (int r = 0; r < 2; ++r)
      c.push_back({std::string("shard P=2 ") + (kind == dist::RowOwner::kModP ? "mod" : "contiguous") + " rank " +
                       std::to_string(r),
                   [kind, r](const std::vector<float>& w) { return shard_of(w, {V, 2, kind}, r); }, true, exact});
  return c;
}

// The ids a storage holds, scrambled, each twice.
std::vector<int32_t> held_ids(const TokenTable& t) {
  std::vector<int32_t> ids;
  for (int64_t id = 0; id < V; ++id)
    if (t.holds(id)) ids.push_back(static_cast<int32_t>(id)), ids.push_back(static_cast<int32_t>(id));
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  return ids;
}

}  // namespace

TEST(RowStore, GatherMatchesReferenceOnEveryStorage) {
  const std::vector<float> whole = randn(V * d, 11, 0.7f);
  int64_t covered = 0;
  for (const StorageCase& c : storages()) {
    const TokenTable t = c.make(whole);
    const std::vector<int32_t> ids = held_ids(t);
    ASSERT_FALSE(ids.empty()) << c.name;
    const int64_t n = static_cast<int64_t>(ids.size());
    std::vector<float> fast(static_cast<size_t>(n * d), -1.0f), ref(fast.size(), -2.0f);
    std::vector<std::atomic<int>> seen(static_cast<size_t>(t.rows));
    gather_rows(fast.data(), t, ids.data(), n, [&](int64_t table, int64_t row) {
      EXPECT_EQ(table, 3);
      seen[static_cast<size_t>(row)]++;
    }, 3);
    gather_rows_ref(ref.data(), t, ids.data(), n);
    EXPECT_EQ(0, std::memcmp(fast.data(), ref.data(), sizeof(float) * fast.size())) << c.name << ": fast != reference";
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(seen[static_cast<size_t>(t.row_of(ids[i]))].load(), 2) << c.name << " id " << ids[i];
      const float* w = whole.data() + ids[i] * d;
      double mx = 0;
      for (int64_t j = 0; j < d; ++j) mx = std::max(mx, static_cast<double>(std::fabs(w[j])));
      for (int64_t j = 0; j < d; ++j) ASSERT_LE(std::fabs(fast[i * d + j] - w[j]), c.bound(mx)) << c.name << " id " << ids[i];
    }
    if (c.name.rfind("shard P=2", 0) == 0) covered += t.rows;
  }
  EXPECT_EQ(covered, 2 * V);  // each split's two shards hold every id once
}

TEST(RowStore, ScatterMatchesReferenceAndReadOnlyStorageRefusesIt) {
  const std::vector<float> whole = randn(V * d, 12, 0.7f);
  for (const StorageCase& c : storages()) {
    TokenTable fast = c.make(whole), ref = c.make(whole);
    std::vector<int32_t> ids = held_ids(fast);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    ids.resize(std::min<size_t>(ids.size(), 9));
    const int64_t n = static_cast<int64_t>(ids.size());
    const std::vector<float> rows = randn(static_cast<size_t>(n * d), 13);
    if (!c.writable) {
      EXPECT_THROW(scatter_rows(fast, ids.data(), rows.data(), n), Error) << c.name;
      continue;
    }
    scatter_rows(fast, ids.data(), rows.data(), n);
    scatter_rows_ref(ref, ids.data(), rows.data(), n);
    EXPECT_EQ(fast.to_vector(), ref.to_vector()) << c.name;
    std::vector<float> back(rows.size());
    gather_rows(back.data(), fast, ids.data(), n);
    EXPECT_EQ(back, rows) << c.name;
  }
}

TEST(RowStore, AnIdTheStorageDoesNotHoldIsRefusedByName) {
  const std::vector<float> whole = randn(V * d, 14);
  for (const StorageCase& c : storages()) {
    TokenTable t = c.make(whole);
    int32_t missing = -1;
    for (int32_t id = 0; id < V && missing < 0; ++id)
      if (!t.holds(id)) missing = id;
    for (int32_t bad : {missing, static_cast<int32_t>(V), static_cast<int32_t>(-3)}) {
      if (bad == -1) continue;  // a whole table holds every id in range
      std::vector<float> out(d);
      try {
        gather_rows(out.data(), t, &bad, 1);
        ADD_FAILURE() << c.name << ": id " << bad << " was gathered";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("id " + std::to_string(bad)), std::string::npos) << e.what();
      }
      if (c.writable) {
        EXPECT_THROW(scatter_rows(t, &bad, out.data(), 1), Error) << c.name;
      }
    }
  }
}
