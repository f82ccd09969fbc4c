// The token-major table store (model/table_store.h): a store written from RAM tables of every
// dtype reads back every row bit for bit like the RAM table (several tables of different dims and
// dtypes in one block; blocks smaller and larger than a page), its CLOCK cache evicts and counts,
// and a torn, truncated or altered store, or a bad manifest, is refused naming the file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "op_test_util.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "model/table_store.h"
#include "model/token_table.h"

using namespace jtok;
using jtok::testing::randn;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& tag) {
  static int n = 0;
  const std::string d = ::testing::TempDir() + "table_store_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(n++);
  fs::remove_all(d);
  return d;
}

// Three tables of one vocabulary: f32 (dim d0), bf16 (dim 5), int8 (dim 7).
std::vector<TokenTable> mixed_tables(int64_t V, int64_t d0) {
  return {TokenTable::in_ram(V, d0, randn(V * d0, 1)), quantize_table(TokenTable::in_ram(V, 5, randn(V * 5, 2)), Dtype::bf16),
          quantize_table(TokenTable::in_ram(V, 7, randn(V * 7, 3)), Dtype::int8)};
}

void expect_error_naming(const std::string& dir, const std::string& needle) {
  try {
    TableStore::open(dir, 1 << 20);
    ADD_FAILURE() << "store " << dir << " was opened; expected an error naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(TableStore, EveryRowReadsBackLikeTheRamTable) {
  for (int64_t d0 : {16, 1500}) {  // blocks of 112 B (36 a page) and of 6,028 B (two pages a token)
    const int64_t V = 301;
    const std::vector<TokenTable> ram = mixed_tables(V, d0);
    const std::string dir = fresh_dir("rows");
    write_table_store(dir, ram, {"a", "b", "c"});
    auto store = TableStore::open(dir, 3 * 4096);
    for (size_t k = 0; k < ram.size(); ++k) {
      const TokenTable disk = TokenTable::on_disk(store, static_cast<int64_t>(k));
      ASSERT_EQ(disk.dtype(), ram[k].dtype());
      std::vector<float> a(ram[k].dim), b(ram[k].dim);
      for (int64_t id = V - 1; id >= 0; --id) {
        ram[k].read_row(id, a.data());
        disk.read_row(id, b.data());
        disk.read_row(id, b.data());  // again: the cached block
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * a.size())) << "table " << k << " id " << id;
      }
    }
    const TableStore::Stats st = store->stats();
    EXPECT_GT(st.misses, V);  // the cache holds fewer blocks than the tables: evicted and read again
    EXPECT_GE(st.hits, 3 * V);
    EXPECT_EQ(st.bytes_read % 4, 0);
  }
}

TEST(TableStore, TornTruncatedOrAlteredStoresAreRefusedNamingTheFile) {
  const std::vector<TokenTable> ram = mixed_tables(50, 8);
  const std::string good = fresh_dir("good");
  write_table_store(good, ram, {"a", "b", "c"});
  EXPECT_THROW(write_table_store(good, ram, {"a", "b", "c"}), Error);  // exists: never overwritten
  auto variant = [&](const std::string& tag) {
    const std::string d = fresh_dir(tag);
    fs::copy(good, d, fs::copy_options::recursive);
    return d;
  };
  {  // truncated data file
    const std::string d = variant("trunc");
    fs::resize_file(fs::path(d) / "tables.bin", fs::file_size(fs::path(d) / "tables.bin") - 100);
    expect_error_naming(d, "tables.bin");
  }
  {  // one byte altered: the checksum
    const std::string d = variant("flip");
    std::fstream f(fs::path(d) / "tables.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(77);
    f.put('\x5a');
    f.close();
    expect_error_naming(d, "checksum");
  }
  {  // manifest torn (not JSON), missing, and with a field of the wrong type
    const std::string d = variant("torn");
    const std::string m = read_file((fs::path(d) / "manifest.json").string());
    write_file_atomic((fs::path(d) / "manifest.json").string(), m.substr(0, m.size() / 2));
    expect_error_naming(d, "manifest.json");
    fs::remove(fs::path(d) / "manifest.json");
    expect_error_naming(d, "manifest.json");
    std::string bad = m;
    bad.replace(bad.find("\"ids\""), 5, "\"idz\"");
    write_file_atomic((fs::path(d) / "manifest.json").string(), bad);
    expect_error_naming(d, "manifest.json");
  }
  EXPECT_NO_THROW(TableStore::open(good, 1 << 20));
}
