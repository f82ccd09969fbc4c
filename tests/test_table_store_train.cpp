// The training table store (store/train_table_store.h) under the one table optimizer
// (train/table_optimizer.h), against the same tables in RAM:
//   - steps of the deferred exact ("dense") and the lazy optimizer, with reads (gathers with the
//     row-sync hook) between them, through a cache of two units (so units are evicted and written
//     back), leave values, moments and row steps bit for bit equal to RAM's, in two geometries
//     (many tokens to a 4 KiB unit, and one token over two pages);
//   - a crash after a checkpoint (the store dropped without a flush, units already written back, a
//     torn record at the log's end) reopens at the checkpoint and continues bit for bit; a crash
//     between flush and seal reopens at either step; any other step is refused naming the log;
//   - a truncated data file, an altered unit, a bad manifest, a torn or missing log are refused
//     naming the file;
//   - a full disk (RLIMIT_FSIZE: the undo log cannot grow) stops the run with an error naming the
//     log, and the reopened store continues from the checkpoint bit for bit.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "store/train_table_store.h"
#include "core/checksum.h"
#include "model/token_table.h"
#include "temp_dir.h"
#include "train/disk_tables.h"
#include "train/table_optimizer.h"

using namespace jtok;
namespace fs = std::filesystem;

namespace {

constexpr int64_t V = 61;

std::string fresh_dir() { return jtok::testing::fresh_temp_dir("train_store"); }

std::vector<TokenTable> initial_tables(const std::vector<int64_t>& dims) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<TokenTable> t;
  for (int64_t d : dims) {
    std::vector<float> w(static_cast<size_t>(V * d));
    for (auto& x : w) x = nd(rng);
    t.push_back(TokenTable::in_ram(V, d, std::move(w)));
  }
  return t;
}

// Tables, their gradients and AdamW state: in RAM, or in a training store (cache of two units).
struct TableRun {
  std::vector<TokenTable> tables;
  std::vector<SparseRowGrad> grads;
  TableMoments st;
  std::shared_ptr<TrainTableStore> store;
  bool dense = true;

  void grads_for(int64_t step) {  // a few ids (repeats of small ids) with random rows, by step
    std::mt19937 rng(static_cast<uint32_t>(1000 + step));
    std::uniform_int_distribution<int> id(0, V - 1), small(0, 5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& g : grads) {
      g.clear();
      for (int i = 0; i < 7; ++i) {
        float* row = g.row(i % 2 ? small(rng) : id(rng));
        for (int64_t j = 0; j < g.dim; ++j) row[j] += nd(rng);
      }
    }
  }
  std::function<void(int64_t step)> before_step;  // e.g. the read-ahead of a trainer
  // Step `step` (from 1), then a read of a few rows through the gather with the sync hook.
  std::vector<float> step(int64_t step) {
    if (before_step) before_step(step);
    grads_for(step);
    AdamWHyper h{0.02f * (1.0f + 0.1f * static_cast<float>(step % 5)), 0.9f, 0.95f, 1e-8f, 0.1f, step};
    TableOptimizer opt(tables, grads, st);
    opt.step(h, dense);
    std::mt19937 rng(static_cast<uint32_t>(2000 + step));
    std::uniform_int_distribution<int32_t> id(0, V - 1);
    std::vector<int32_t> ids = {id(rng), id(rng), id(rng), static_cast<int32_t>(V - 1)};
    std::vector<float> out;
    for (size_t k = 0; k < tables.size(); ++k) {
      std::vector<float> rows(ids.size() * static_cast<size_t>(tables[k].dim));
      gather_rows(rows.data(), tables[k], ids.data(), static_cast<int64_t>(ids.size()), opt.row_sync(), static_cast<int64_t>(k));
      out.insert(out.end(), rows.begin(), rows.end());
    }
    if (store) store->check();
    return out;
  }
  // Every row brought current, then (values, m, v, step) of every row of every table.
  std::vector<float> state() {
    TableOptimizer(tables, grads, st).sync_all();
    std::vector<float> out;
    for (size_t k = 0; k < tables.size(); ++k) {
      const int64_t d = tables[k].dim;
      std::vector<float> p(d), m(d), v(d);
      for (int64_t r = 0; r < V; ++r) {
        int32_t s;
        if (store) {
          EXPECT_TRUE(store->load_row(static_cast<int64_t>(k), r, p.data(), m.data(), v.data(), &s));
        } else {
          std::memcpy(p.data(), tables[k].row(r), 4 * d);
          std::memcpy(m.data(), st.m[k].data() + r * d, 4 * d);
          std::memcpy(v.data(), st.v[k].data() + r * d, 4 * d);
          s = st.row_step[k][r];
        }
        for (auto* a : {&p, &m, &v}) out.insert(out.end(), a->begin(), a->end());
        out.push_back(static_cast<float>(s));
      }
    }
    if (store) store->check();
    return out;
  }
};

TableRun ram_run(const std::vector<int64_t>& dims, bool dense) {
  TableRun r;
  r.tables = initial_tables(dims);
  for (auto& t : r.tables) r.grads.emplace_back().init(V, t.dim);
  r.st = make_table_moments(r.tables, true, 0);
  r.dense = dense;
  return r;
}

// The store at dir opened at `step` (kept constants from `kept`, a checkpoint's).
TableRun disk_run(const std::string& dir, const std::vector<int64_t>& dims, bool dense, int64_t step, const TableMoments* kept,
                  int64_t cache_bytes = 0, bool direct_io = false) {
  TableRun r;
  r.store = TrainTableStore::open(dir, cache_bytes, step, 4, direct_io ? TableIo::direct : TableIo::pread);  // default: the smallest cache, two units
  for (size_t k = 0; k < dims.size(); ++k) r.tables.push_back(TokenTable::on_disk(disk_rows(r.store, static_cast<int64_t>(k))));
  for (auto& t : r.tables) r.grads.emplace_back().init(V, t.dim);
  r.st = make_table_moments(r.tables, true, step);
  if (kept) r.st.consts = kept->consts, r.st.consts_base = kept->consts_base;
  r.dense = dense;
  return r;
}

std::string make_store(const std::vector<int64_t>& dims) {
  const std::string dir = fresh_dir();
  create_train_store(dir, initial_tables(dims), std::vector<std::string>(dims.size(), "t"), 0);
  return dir;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

struct Geometry {
  std::vector<int64_t> dims;
};
const Geometry kSmall{{8, 12, 5}};  // 3 tables, 312-byte blocks: 13 tokens a 4 KiB unit, 5 units
const Geometry kLarge{{8, 400}};    // a 4,904-byte block: one token over two pages

}  // namespace

class TrainStoreSteps : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(TrainStoreSteps, MatchesRamBitForBit) {
  const auto& dims = std::get<0>(GetParam()) == 0 ? kSmall.dims : kLarge.dims;
  const bool dense = std::get<1>(GetParam());
  TableRun ram = ram_run(dims, dense), disk = disk_run(make_store(dims), dims, dense, 0, nullptr);
  for (int64_t s = 1; s <= 12; ++s) ASSERT_TRUE(same_bits(ram.step(s), disk.step(s))) << "gathered rows differ after step " << s;
  EXPECT_GT(disk.store->stats().bytes_written, 0) << "the cache of two units must have written units back";
  EXPECT_TRUE(same_bits(ram.state(), disk.state()));
}

// Read-ahead racing the steps: before each step, random ids (some of this step's, some of the
// next's) queued for the I/O threads and not waited for, through caches of 2 units and of 3 units
// read with O_DIRECT: values, moments and steps still equal RAM's bit for bit.
TEST_P(TrainStoreSteps, WithReadAheadMatchesRamBitForBit) {
  const auto& dims = std::get<0>(GetParam()) == 0 ? kSmall.dims : kLarge.dims;
  const bool dense = std::get<1>(GetParam());
  for (int64_t cache_units : {2, 3}) {
    const int64_t unit_bytes = std::get<0>(GetParam()) == 0 ? 4096 : 8192;
    const bool direct = cache_units == 3;  // and units read with O_DIRECT
    TableRun ram = ram_run(dims, dense),
             disk = disk_run(make_store(dims), dims, dense, 0, nullptr, cache_units * unit_bytes, direct);
    disk.before_step = [&](int64_t step) {
      std::mt19937 rng(static_cast<uint32_t>(3000 + step));
      std::uniform_int_distribution<int32_t> id(0, V - 1);
      std::vector<int32_t> ids(12);
      for (auto& x : ids) x = id(rng);
      disk.store->begin_step(step);
      disk.store->prefetch(ids.data(), 6, step);
      disk.store->prefetch(ids.data() + 6, 6, step + 1);
    };
    for (int64_t s = 1; s <= 12; ++s) ASSERT_TRUE(same_bits(ram.step(s), disk.step(s))) << "rows differ after step " << s;
    disk.store->drain_prefetch();
    const TrainTableStore::Stats st = disk.store->stats();
    EXPECT_GT(st.read_ahead, 0) << "the I/O threads read nothing";
    EXPECT_GT(st.units_written, 0);
    EXPECT_TRUE(same_bits(ram.state(), disk.state())) << cache_units << " units of cache" << (direct ? ", O_DIRECT" : "");
  }
}

INSTANTIATE_TEST_SUITE_P(All, TrainStoreSteps, ::testing::Combine(::testing::Values(0, 1), ::testing::Bool()));

// The read-ahead reads the units it is given: read afterwards, they are all hits.
TEST(TrainStoreReadAhead, ReadsWhatItIsGiven) {
  const auto& dims = kSmall.dims;  // 13 tokens a unit, 5 units
  const std::string dir = make_store(dims);
  auto store = TrainTableStore::open(dir, 5 * 4096, 0);
  std::vector<int32_t> ids(V);
  for (int32_t i = 0; i < V; ++i) ids[i] = i;
  store->begin_step(0);
  EXPECT_EQ(store->prefetch(ids.data(), V, 0), 5);
  store->drain_prefetch();
  std::vector<float> row(8);
  for (int32_t i = 0; i < V; ++i) store->read_value(0, i, row.data());
  const TrainTableStore::Stats st = store->stats();
  EXPECT_EQ(st.read_ahead, 5);
  EXPECT_EQ(st.units_read, 5);
  EXPECT_EQ(st.misses, 0);
  EXPECT_EQ(st.hits + st.waits, V);
  EXPECT_EQ(st.rows_read, V);
  EXPECT_EQ(store->prefetch(ids.data(), V, 0), 0) << "everything is cached: nothing to queue";
  std::vector<int32_t> bad = {static_cast<int32_t>(V)};
  expect_error([&] { store->prefetch(bad.data(), 1, 0); }, "outside");
  store->check();
}

// A cache of 3 units: the units marked for the current step are never evicted by the read-ahead
// (it skips what has no free slot), and a dirty unit it does evict (a past step's) is written back
// first, so its rows read later are the ones stored.
TEST(TrainStoreReadAhead, KeepsTheCurrentStepAndWritesBackWhatItEvicts) {
  const auto& dims = kSmall.dims;
  const std::string dir = make_store(dims);
  auto store = TrainTableStore::open(dir, 3 * 4096, 0);
  auto ids_of_units = [](std::vector<int32_t> units) {
    std::vector<int32_t> ids;
    for (int32_t u : units) ids.push_back(u * 13 + 1);  // token 13u + 1 is in unit u
    return ids;
  };
  std::vector<float> p(8, 0.25f), m(8, 0.5f), v(8, 0.75f), row(8);
  store->begin_step(1);
  std::vector<int32_t> cur = ids_of_units({0, 1});
  store->prefetch(cur.data(), 2, 1);
  store->drain_prefetch();
  store->store_row(0, cur[0], p.data(), m.data(), v.data(), 1);  // unit 0 dirty
  std::vector<int32_t> next = ids_of_units({2, 3, 4});
  store->prefetch(next.data(), 3, 2);
  store->drain_prefetch();
  TrainTableStore::Stats st = store->stats();
  EXPECT_EQ(st.read_ahead, 3) << "units 0, 1 and one of the next step's";
  EXPECT_EQ(st.prefetch_skipped, 2) << "no slot for the other two: units 0 and 1 are the current step's";
  EXPECT_EQ(st.units_written, 0);
  for (int32_t id : cur) store->read_value(0, id, row.data());
  EXPECT_EQ(store->stats().misses, 0) << "the current step's units were evicted";
  store->begin_step(2);  // units 0 and 1 are a past step's now: the read-ahead may take their slots
  store->prefetch(next.data(), 3, 2);
  store->drain_prefetch();
  st = store->stats();
  EXPECT_EQ(st.read_ahead, 5);
  EXPECT_EQ(st.units_written, 1) << "the dirty unit 0 written back when evicted";
  store->read_value(0, cur[0], row.data());  // a miss: read back from the file
  EXPECT_EQ(std::memcmp(row.data(), p.data(), 4 * p.size()), 0);
  EXPECT_EQ(store->stats().misses, 1);
  store->check();
}

TEST(TrainStore, CrashAfterCheckpointRollsBack) {
  for (bool dense : {true, false}) {
    const auto& dims = kSmall.dims;
    TableRun ram = ram_run(dims, dense);
    for (int64_t s = 1; s <= 12; ++s) ram.step(s);
    const std::string dir = make_store(dims);
    TableMoments kept;
    {
      TableRun a = disk_run(dir, dims, dense, 0, nullptr);
      for (int64_t s = 1; s <= 4; ++s) a.step(s);
      a.store->flush(4);
      kept = a.st;  // the checkpoint's kept constants
      a.store->seal(4);
      const int64_t before = a.store->stats().bytes_written;
      for (int64_t s = 5; s <= 8; ++s) a.step(s);
      ASSERT_GT(a.store->stats().bytes_written, before) << "units must reach the file before the crash";
    }  // the crash: dropped without a flush
    {
      // A whole record's length of garbage (a torn record), then a record cut short.
      std::ofstream(dir + "/undo.log", std::ios::app | std::ios::binary) << std::string(16 + 4096, 'x') << "cut";
    }
    expect_error([&] { TrainTableStore::open(dir, 0, 8); }, "undo.log");
    TableRun b = disk_run(dir, dims, dense, 4, &kept);
    for (int64_t s = 5; s <= 12; ++s) b.step(s);
    EXPECT_TRUE(same_bits(ram.state(), b.state())) << (dense ? "dense" : "lazy");
  }
}

TEST(TrainStore, CrashBetweenFlushAndSeal) {
  const auto& dims = kSmall.dims;
  TableRun ram = ram_run(dims, true);
  for (int64_t s = 1; s <= 10; ++s) ram.step(s);
  for (int64_t resume_at : {4, 8}) {
    const std::string dir = make_store(dims);
    TableMoments kept4, kept8;
    {
      TableRun a = disk_run(dir, dims, true, 0, nullptr);
      for (int64_t s = 1; s <= 4; ++s) a.step(s);
      a.store->flush(4);
      kept4 = a.st;
      a.store->seal(4);
      for (int64_t s = 5; s <= 8; ++s) a.step(s);
      a.store->flush(8);  // then the crash: the trainer's checkpoint 8 may or may not be complete
      kept8 = a.st;
    }
    expect_error([&] { TrainTableStore::open(dir, 0, 6); }, "undo.log");
    TableRun b = disk_run(dir, dims, true, resume_at, resume_at == 4 ? &kept4 : &kept8);
    for (int64_t s = resume_at + 1; s <= 10; ++s) b.step(s);
    EXPECT_TRUE(same_bits(ram.state(), b.state())) << "resumed at " << resume_at;
  }
}

TEST(TrainStore, TornOrAlteredStoreRefused) {
  const auto& dims = kSmall.dims;
  {
    const std::string dir = make_store(dims);
    fs::resize_file(dir + "/tables.bin", fs::file_size(dir + "/tables.bin") - 100);
    expect_error([&] { TrainTableStore::open(dir, 0, 0); }, "tables.bin");
  }
  {
    const std::string dir = make_store(dims);
    {
      std::fstream f(dir + "/tables.bin", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(4096 + 17);  // unit 1: tokens 13..25
      f.put('\x5a');
    }
    TableRun r = disk_run(dir, dims, true, 0, nullptr);
    std::vector<float> row(8);
    r.tables[0].read_row(3, row.data());  // unit 0: fine
    EXPECT_NO_THROW(r.store->check());
    r.tables[0].read_row(20, row.data());
    expect_error([&] { r.store->check(); }, "tables.bin: unit 1");
  }
}

// The unit checksum (core/checksum.h sum64) changes under every single-bit flip of a 4 KiB
// unit's bytes and under a torn write (the first half of one unit, the rest of another), at every
// length's tail.
TEST(TrainStore, TheUnitSumCatchesEveryBitFlipAndATornUnit) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> a(4088), b(4088);
  for (auto& x : a) x = static_cast<uint8_t>(rng());
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  const uint64_t base = sum64(1, a.data(), a.size());
  for (size_t i = 0; i < a.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      a[i] ^= static_cast<uint8_t>(1 << bit);
      ASSERT_NE(sum64(1, a.data(), a.size()), base) << "byte " << i << " bit " << bit;
      a[i] ^= static_cast<uint8_t>(1 << bit);
    }
  for (size_t cut = 512; cut < a.size(); cut += 512) {
    std::vector<uint8_t> torn(a.begin(), a.begin() + static_cast<int64_t>(cut));
    torn.insert(torn.end(), b.begin() + static_cast<int64_t>(cut), b.end());
    EXPECT_NE(sum64(1, torn.data(), torn.size()), base) << "cut " << cut;
  }
  for (size_t n = 1; n < 70; ++n) {  // every tail length: the length and the last byte count
    EXPECT_NE(sum64(1, a.data(), n), sum64(1, a.data(), n - 1)) << n;
    std::vector<uint8_t> c(a.begin(), a.begin() + static_cast<int64_t>(n));
    c.back() ^= 0x80;
    EXPECT_NE(sum64(1, c.data(), n), sum64(1, a.data(), n)) << n;
  }
  EXPECT_NE(sum64(1, a.data(), a.size()), sum64(2, a.data(), a.size()));
}

TEST(TrainStore, BadManifestOrLogRefused) {
  const auto& dims = kSmall.dims;
  auto edit = [](const std::string& path, const std::string& from, const std::string& to) {
    std::ifstream in(path);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = s.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    s.replace(at, from.size(), to);
    std::ofstream(path, std::ios::trunc) << s;
  };
  {
    const std::string dir = make_store(dims);
    edit(dir + "/manifest.json", "\"per_page\": 13", "\"per_page\": 12");
    expect_error([&] { TrainTableStore::open(dir, 0, 0); }, "manifest.json");
  }
  {
    const std::string dir = make_store(dims);
    edit(dir + "/manifest.json", "jtok-table-store-train-2", "jtok-table-store-1");
    expect_error([&] { TrainTableStore::open(dir, 0, 0); }, "manifest.json");
  }
  {  // an older jtok's store (FNV-1a unit sums) is refused, naming the format
    const std::string dir = make_store(dims);
    edit(dir + "/manifest.json", "jtok-table-store-train-2", "jtok-table-store-train-1");
    expect_error([&] { TrainTableStore::open(dir, 0, 0); }, "an older jtok's");
  }
  {
    const std::string dir = make_store(dims);
    edit(dir + "/undo.log", "JTOKUNDO", "JTOKUNDX");
    expect_error([&] { TrainTableStore::open(dir, 0, 0); }, "undo.log");
  }
  {
    const std::string dir = make_store(dims);
    fs::resize_file(dir + "/undo.log", 20);
    expect_error([&] { TrainTableStore::open(dir, 0, 0); }, "undo.log");
  }
  {
    const std::string dir = make_store(dims);
    fs::remove(dir + "/undo.log");
    expect_error([&] { TrainTableStore::open(dir, 0, 0); }, "undo.log");
  }
}

TEST(TrainStore, FullDiskLosesNothing) {
  const auto& dims = kSmall.dims;
  TableRun ram = ram_run(dims, true);
  for (int64_t s = 1; s <= 10; ++s) ram.step(s);
  const std::string dir = make_store(dims);
  TableMoments kept;
  {
    TableRun a = disk_run(dir, dims, true, 0, nullptr);
    for (int64_t s = 1; s <= 4; ++s) a.step(s);
    a.store->flush(4);
    kept = a.st;
    a.store->seal(4);
    // The disk is full: no write may go past byte 32 of any file (the empty log is 32 bytes).
    struct rlimit old {};
    getrlimit(RLIMIT_FSIZE, &old);
    auto* prev = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old;
    lim.rlim_cur = 32;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
    bool failed = false;
    for (int64_t s = 5; s <= 10 && !failed; ++s) {
      try {
        a.step(s);
      } catch (const Error& e) {
        failed = true;
        EXPECT_NE(std::string(e.what()).find("undo.log"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("rolls back to its checkpoint at step 4"), std::string::npos) << e.what();
      }
    }
    if (!failed) expect_error([&] { a.store->flush(10); }, "undo.log");
    setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, prev);
  }
  TableRun b = disk_run(dir, dims, true, 4, &kept);
  for (int64_t s = 5; s <= 10; ++s) b.step(s);
  EXPECT_TRUE(same_bits(ram.state(), b.state()));
}
