// The token-major table store (store/table_store.h): a store written from RAM tables of every
// dtype reads back every row bit for bit like the RAM table (several tables of different dims and
// dtypes in one block; blocks of under half a page, of more than half and of more than a page), its CLOCK cache evicts
// and counts, and a torn, truncated or altered store, or a bad manifest, is refused naming the file. Read-ahead
// (TableStore::prefetch, its I/O threads): a prefetched id is read once and then hits, the rows equal
// those read without it, and concurrent prefetches and gathers from several threads read every row
// right with counters that add up. A read that fails after open (a truncated file) is kept and
// reported once by check_table_reads, naming the file and the offset. The manifest records the
// store's source (older ones without it open); O_DIRECT reads give the pread rows, page by page.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "op_test_util.h"
#include "temp_dir.h"
#include "core/atomic_file.h"
#include "core/checksum.h"
#include "core/error.h"
#include "store/table_store.h"
#include "train/store_export.h"
#include "model/token_table.h"

using namespace jtok;
using jtok::testing::randn;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& tag) { return jtok::testing::fresh_temp_dir("table_store_" + tag); }

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
  // Blocks of 112 B (36 a page), 2,824 B (one a page: more than half a page) and 6,028 B (two pages a token).
  for (int64_t d0 : {16, 700, 1500}) {
    const int64_t V = 301;
    const std::vector<TokenTable> ram = mixed_tables(V, d0);
    const std::string dir = fresh_dir("rows");
    write_table_store(dir, ram, {"a", "b", "c"});
    auto store = TableStore::open(dir, 3 * 4096);
    for (size_t k = 0; k < ram.size(); ++k) {
      const TokenTable disk = TokenTable::on_disk(disk_rows(store, static_cast<int64_t>(k)));
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

namespace {

// Every row of ids[0..n) of the three disk tables equals the RAM table's, bit for bit.
void expect_rows_equal(const std::vector<TokenTable>& ram, const std::vector<TokenTable>& disk, const std::vector<int32_t>& ids) {
  for (size_t k = 0; k < ram.size(); ++k) {
    std::vector<float> a(ids.size() * ram[k].dim), b(a.size());
    gather_rows_ref(a.data(), ram[k], ids.data(), static_cast<int64_t>(ids.size()));
    gather_rows(b.data(), disk[k], ids.data(), static_cast<int64_t>(ids.size()));
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * a.size())) << "table " << k;
  }
}

std::vector<TokenTable> disk_tables(const std::shared_ptr<TableStore>& store, size_t k) {
  std::vector<TokenTable> out;
  for (size_t i = 0; i < k; ++i) out.push_back(TokenTable::on_disk(disk_rows(store, static_cast<int64_t>(i))));
  return out;
}

}  // namespace

TEST(TableStore, PrefetchedIdsAreReadOnceAndThenHit) {
  const int64_t V = 300;
  const std::vector<TokenTable> ram = mixed_tables(V, 16);
  const std::string dir = fresh_dir("prefetch_hit");
  write_table_store(dir, ram, {"a", "b", "c"});
  auto store = TableStore::open(dir, 1 << 20, 3);
  const std::vector<TokenTable> disk = disk_tables(store, ram.size());
  const std::vector<int32_t> ids = {7, 5, 7, 9, 5, 299};  // 4 distinct
  EXPECT_EQ(prefetch_rows(disk[1], ids.data(), static_cast<int64_t>(ids.size())), 4);  // any table: the store's blocks
  store->drain_prefetch();
  TableStore::Stats st = store->stats();
  EXPECT_EQ(st.reads, 4);
  EXPECT_EQ(st.prefetch_reads, 4);
  EXPECT_EQ(st.prefetch_queued, 4);
  EXPECT_EQ(st.bytes_read, 4 * store->block_bytes());
  EXPECT_EQ(st.hits + st.misses + st.waits, 0);  // no lookup yet
  EXPECT_EQ(prefetch_rows(disk[0], ids.data(), 2), 0);  // cached: nothing queued
  expect_rows_equal(ram, disk, ids);
  st = store->stats();
  EXPECT_EQ(st.hits, 3 * 6);  // every lookup of every table a hit
  EXPECT_EQ(st.misses, 0);
  EXPECT_EQ(st.reads, 4);
  EXPECT_GT(st.read_ns, 0);
  const int32_t bad = static_cast<int32_t>(V);
  EXPECT_THROW(store->prefetch(&bad, 1), Error);
}

TEST(TableStore, PrefetchGivesTheSameRowsAsNoPrefetch) {
  for (int64_t d0 : {16, 1500}) {  // blocks within a page, and of two pages
    const int64_t V = 257;
    const std::vector<TokenTable> ram = mixed_tables(V, d0);
    const std::string dir = fresh_dir("prefetch_same");
    write_table_store(dir, ram, {"a", "b", "c"});
    auto with = TableStore::open(dir, 4 * 4096, 2), without = TableStore::open(dir, 4 * 4096, 2);
    const std::vector<TokenTable> dw = disk_tables(with, ram.size()), dn = disk_tables(without, ram.size());
    std::vector<int32_t> ids(24);
    for (int step = 0; step < 40; ++step) {  // a "decode": announce the next step's ids, read this step's
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((step * 131 + i * i * 17) % V);
      with->prefetch(ids.data(), static_cast<int64_t>(ids.size()));
      for (size_t k = 0; k < ram.size(); ++k) {
        std::vector<float> a(ids.size() * ram[k].dim), b(a.size());
        gather_rows(a.data(), dw[k], ids.data(), static_cast<int64_t>(ids.size()));
        gather_rows(b.data(), dn[k], ids.data(), static_cast<int64_t>(ids.size()));
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * a.size())) << "d0 " << d0 << " step " << step;
      }
      expect_rows_equal(ram, dw, ids);
    }
    const TableStore::Stats s = with->stats();
    EXPECT_GT(s.prefetch_queued, 0);
    EXPECT_EQ(without->stats().prefetch_reads, 0);
    // Each block read once per residency: a lookup either hit, waited for a read, or read it itself.
    EXPECT_EQ(s.reads, s.misses + s.prefetch_reads);
    const TableStore::Stats n = without->stats();
    EXPECT_EQ(s.hits + s.waits + s.misses, 2 * (n.hits + n.misses));  // its rows read twice a step
  }
}

// Several threads announce and read overlapping ids through a cache far smaller than the tables
// (so blocks are evicted, queued, taken over by a reader and waited for); every row read equals the
// RAM table's, and the counters add up. Run under ASan + UBSan too (scripts/test_asan.sh).
TEST(TableStore, ConcurrentPrefetchAndGathersFromSeveralThreads) {
  const int64_t V = 500;
  const std::vector<TokenTable> ram = mixed_tables(V, 40);
  const std::string dir = fresh_dir("concurrent");
  write_table_store(dir, ram, {"a", "b", "c"});
  auto store = TableStore::open(dir, 3 * 4096, 4);  // 66 slots of 184 bytes for 500 tokens
  const std::vector<TokenTable> disk = disk_tables(store, ram.size());
  // Read-ahead that certainly reads (under load the gathering threads below may reach every block
  // before the I/O pool does, so their own prefetches need not read any).
  const std::vector<int32_t> first = {0, 1, 2, 3};
  store->prefetch(first.data(), static_cast<int64_t>(first.size()));
  store->drain_prefetch();
  ASSERT_EQ(store->stats().prefetch_reads, static_cast<int64_t>(first.size()));
  constexpr int kThreads = 4, kSteps = 150, kIds = 12;
  std::vector<std::string> errors(kThreads);
  std::vector<int64_t> lookups(kThreads, 0);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th)
    threads.emplace_back([&, th] {
      std::vector<int32_t> ids(kIds);
      for (int step = 0; step < kSteps && errors[th].empty(); ++step) {
        for (int i = 0; i < kIds; ++i) ids[i] = static_cast<int32_t>((step * 37 + i * 53 + th * 11 + i * i) % V);
        if (step % 3 != 2) store->prefetch(ids.data(), kIds);  // some steps read without announcing
        for (size_t k = 0; k < ram.size(); ++k) {
          std::vector<float> a(kIds * ram[k].dim), b(a.size());
          gather_rows_ref(a.data(), ram[k], ids.data(), kIds);
          gather_rows(b.data(), disk[k], ids.data(), kIds);
          lookups[th] += kIds;
          if (std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) != 0)
            errors[th] = "thread " + std::to_string(th) + " step " + std::to_string(step) + " table " + std::to_string(k);
        }
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_TRUE(e.empty()) << e;
  store->drain_prefetch();
  const TableStore::Stats s = store->stats();
  int64_t total = 0;
  for (int64_t l : lookups) total += l;
  EXPECT_EQ(s.hits + s.waits + s.misses, total);
  EXPECT_EQ(s.reads, s.misses + s.prefetch_reads);
  EXPECT_EQ(s.bytes_read, s.reads * store->block_bytes());
  EXPECT_GT(s.prefetch_reads, 0);
  EXPECT_GT(s.reads, 3 * 4096 / store->block_bytes());  // evictions: more reads than slots
}

// A file truncated after the store was opened: the gathers (in parallel loops: nothing may throw)
// give zeros for the rows they cannot read and go on; check_table_reads then fails once, naming the
// file, the token, the byte offset and the cause, and the rows still in the file read right after.
TEST(TableStore, AFailedReadIsKeptAndReportedOnceNamingTheFileAndOffset) {
  const int64_t V = 2000;
  const std::vector<TokenTable> ram = mixed_tables(V, 16);
  const std::string dir = fresh_dir("read_error");
  write_table_store(dir, ram, {"a", "b", "c"});
  auto store = TableStore::open(dir, 8 * 4096, 2);
  const std::vector<TokenTable> disk = {TokenTable::on_disk(disk_rows(store, 0)), TokenTable::on_disk(disk_rows(store, 1)), TokenTable::on_disk(disk_rows(store, 2))};
  fs::resize_file(dir + "/tables.bin", 4096 * 20);  // 20 pages remain: tokens 0..599 are in them, 1500.. are not
  const int64_t n = 1100;  // 17,600 values: the parallel gather (kParallelMin)
  std::vector<int32_t> low(n), high(n);
  for (int64_t i = 0; i < n; ++i) low[i] = static_cast<int32_t>(i % 600), high[i] = static_cast<int32_t>(1500 + i % 500);
  std::vector<float> got(n * 16, 1.0f), want(n * 16);
  gather_rows(got.data(), disk[0], high.data(), n);
  for (float x : got) ASSERT_EQ(x, 0.0f);
  try {
    check_table_reads(disk);
    ADD_FAILURE() << "a failed read was not reported";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(dir + "/tables.bin at byte "), std::string::npos) << m;
    EXPECT_NE(m.find("cannot read token 1"), std::string::npos) << m;
    EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(check_table_reads(disk));  // reported once
  gather_rows(got.data(), disk[0], low.data(), n);
  gather_rows(want.data(), ram[0], low.data(), n);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * got.size()));
  EXPECT_NO_THROW(check_table_reads(disk));
}

// The manifest's source: written when given, read back, described; a store without one (written
// before manifests recorded it) opens with an empty source; a mistyped source field is refused.
TEST(TableStore, TheManifestRecordsItsSourceAndAStoreWithoutOneOpens) {
  const std::vector<TokenTable> ram = mixed_tables(40, 8);
  const std::string plain = fresh_dir("src_ram"), trained = fresh_dir("src_disk"), old = fresh_dir("src_old");
  TableStoreSource from_ckpt;
  from_ckpt.checkpoint = dir_basename("runs/main/ckpt_000004/");
  from_ckpt.step = 4;
  write_table_store(plain, ram, {"a", "b", "c"}, from_ckpt);
  TableStoreSource from_disk_trained;
  from_disk_trained.checkpoint = "ckpt_000006";
  from_disk_trained.step = 6;
  from_disk_trained.train_store = "store";
  from_disk_trained.train_store_step = 6;
  write_table_store(trained, ram, {"a", "b", "c"}, from_disk_trained);
  write_table_store(old, ram, {"a", "b", "c"});
  TableStoreSource s = TableStore::open(plain, 1 << 20)->source();
  EXPECT_EQ(s.checkpoint, "ckpt_000004");
  EXPECT_EQ(s.step, 4);
  EXPECT_EQ(s.train_store, "");
  EXPECT_NE(describe_source(s).find("checkpoint ckpt_000004, step 4"), std::string::npos) << describe_source(s);
  s = TableStore::open(trained, 1 << 20)->source();
  EXPECT_EQ(s.train_store, "store");
  EXPECT_EQ(s.train_store_step, 6);
  const std::string om = read_file(old + "/manifest.json");
  EXPECT_EQ(om.find("source"), std::string::npos) << om;
  s = TableStore::open(old, 1 << 20)->source();
  EXPECT_EQ(s.checkpoint, "");
  EXPECT_NE(describe_source(s).find("not recorded"), std::string::npos);
  std::string bad = read_file(plain + "/manifest.json");
  const size_t at = bad.find("\"step\": 4");
  ASSERT_NE(at, std::string::npos) << bad;
  bad.replace(at, 9, "\"step\": \"4\"");
  write_file_atomic(plain + "/manifest.json", bad);
  expect_error_naming(plain, "manifest.json");
}

// O_DIRECT reads (--table-direct-io) give every row of the pread store, for blocks packed to a page
// and blocks of two pages, by lookups and by read-ahead, with the same lookups and reads; each read
// is the block's whole aligned page(s), so its bytes are 4096 (or the stride), not the block's.
TEST(TableStore, DirectReadsGiveThePreadRowsReadingWholePages) {
  for (int64_t d0 : {16, 700, 1500}) {
    const int64_t V = 301;
    const std::vector<TokenTable> ram = mixed_tables(V, d0);
    const std::string dir = fresh_dir("direct");
    write_table_store(dir, ram, {"a", "b", "c"});
    const int probe = ::open((dir + "/tables.bin").c_str(), O_RDONLY | O_DIRECT);
    if (probe < 0) GTEST_SKIP() << "the test directory's file system has no O_DIRECT: " << std::strerror(errno);
    ::close(probe);
    auto plain = TableStore::open(dir, 4 << 20, 2), direct = TableStore::open(dir, 4 << 20, 2, TableIo::direct);  // no eviction
    ASSERT_TRUE(direct->direct_io());
    const int64_t page_bytes = plain->block_bytes() <= 4096 ? 4096 : (plain->block_bytes() + 4095) / 4096 * 4096;
    EXPECT_EQ(plain->read_bytes(), plain->block_bytes());
    EXPECT_EQ(direct->read_bytes(), page_bytes);
    std::vector<int32_t> ids;
    for (int64_t id = V - 1; id >= 0; id -= 2) ids.push_back(static_cast<int32_t>(id));
    for (const auto& s : {plain, direct}) {
      const std::vector<int32_t> ahead(ids.begin(), ids.begin() + 8);
      s->prefetch(ahead.data(), static_cast<int64_t>(ahead.size()));
      s->drain_prefetch();
      expect_rows_equal(ram, disk_tables(s, ram.size()), ids);
    }
    const TableStore::Stats p = plain->stats(), d = direct->stats();
    EXPECT_EQ(d.prefetch_reads, 8);
    EXPECT_EQ(d.reads, static_cast<int64_t>(ids.size()));  // each block once
    EXPECT_EQ(d.reads, p.reads);
    EXPECT_EQ(d.hits + d.waits + d.misses, p.hits + p.waits + p.misses);
    EXPECT_GT(d.misses, 0);
    EXPECT_EQ(p.bytes_read, p.reads * plain->block_bytes());
    EXPECT_EQ(d.bytes_read, d.reads * page_bytes) << "block " << plain->block_bytes();
  }
}

// --table-io: auto reads with O_DIRECT exactly where the probe (an O_DIRECT open and one aligned
// page read) succeeds, with the rows of pread; a missing file probes false; pread never goes direct;
// a bad value fails naming the flag.
TEST(TableStore, AutoReadsDirectWhereTheProbeSucceeds) {
  const int64_t V = 77;
  const std::vector<TokenTable> ram = mixed_tables(V, 16);
  const std::string dir = fresh_dir("auto");
  write_table_store(dir, ram, {"a", "b", "c"});
  const std::string data = dir + "/tables.bin";
  const int probe = ::open(data.c_str(), O_RDONLY | O_DIRECT);
  const bool direct_here = probe >= 0;
  if (probe >= 0) ::close(probe);
  EXPECT_EQ(direct_reads_work(data), direct_here);
  EXPECT_FALSE(direct_reads_work(dir + "/no_such_file"));
  auto s = TableStore::open(dir, 1 << 20, 2, TableIo::automatic);
  EXPECT_EQ(s->direct_io(), direct_here);
  EXPECT_FALSE(TableStore::open(dir, 1 << 20, 2, TableIo::pread)->direct_io());
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < V; id += 3) ids.push_back(id);
  expect_rows_equal(ram, disk_tables(s, ram.size()), ids);
  EXPECT_FALSE(use_direct_reads(TableIo::pread, data));
  EXPECT_TRUE(use_direct_reads(TableIo::direct, dir + "/no_such_file"));  // direct insists: the open then fails
  EXPECT_EQ(parse_table_io("auto", "--table-io"), TableIo::automatic);
  EXPECT_EQ(parse_table_io("pread", "--table-io"), TableIo::pread);
  EXPECT_EQ(parse_table_io("direct", "--table-io"), TableIo::direct);
  try {
    parse_table_io("o_direct", "--table-io");
    FAIL() << "accepted o_direct";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--table-io must be auto, direct or pread, got 'o_direct'"), std::string::npos) << e.what();
  }
}

// A store of the older format (jtok-table-store-1: the file summed by FNV-1a 64, field fnv1a64)
// still opens, with the same rows, and a wrong fnv1a64 is refused naming the file and the field;
// the current format's sum64 is sum64_pages over the file.
TEST(TableStore, TheOlderFnvFormatStillOpens) {
  const int64_t V = 90;
  const std::vector<TokenTable> ram = mixed_tables(V, 24);
  const std::string dir = fresh_dir("fnv");
  write_table_store(dir, ram, {"a", "b", "c"});
  const std::string bin = read_file(dir + "/tables.bin"), m = read_file(dir + "/manifest.json");
  const auto* p = reinterpret_cast<const uint8_t*>(bin.data());
  const std::string sum = std::to_string(sum64_pages(kFnvOffset, p, bin.size()));
  const std::string fnv = std::to_string(fnv1a_bytes(kFnvOffset, p, bin.size()));
  ASSERT_NE(m.find("\"sum64\": \"" + sum + "\""), std::string::npos) << m;
  auto older = [&](const std::string& value) {
    std::string o = m;
    o.replace(o.find("jtok-table-store-2"), 18, "jtok-table-store-1");
    o.replace(o.find("\"sum64\": \"" + sum + "\""), 10 + sum.size() + 1, "\"fnv1a64\": \"" + value + "\"");
    write_file_atomic(dir + "/manifest.json", o);
  };
  older(fnv);
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < V; ++id) ids.push_back(id);
  expect_rows_equal(ram, disk_tables(TableStore::open(dir, 1 << 20, 2), ram.size()), ids);
  older("12345");
  try {
    TableStore::open(dir, 1 << 20);
    FAIL() << "a wrong fnv1a64 was accepted";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("tables.bin: checksum " + fnv + " differs from the manifest's fnv1a64 12345"), std::string::npos) << w;
  }
}
