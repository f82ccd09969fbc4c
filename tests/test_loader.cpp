// Data loader: targets are inputs shifted by one, determinism per seed, exact resume from the
// saved state (also through JSON), sequential wrap-around, fixed validation batches, and a clear
// error naming the shard for a token id >= the model's vocab size.
#include <gtest/gtest.h>

#include <algorithm>

#include <filesystem>
#include <fstream>
#include "core/error.h"
#include "data/loader.h"

namespace fs = std::filesystem;
using namespace jtok;

namespace {
struct Fixture {
  fs::path dir;
  std::vector<std::string> paths;
  // Shards whose tokens are their global index mod 997 (so windows are checkable).
  explicit Fixture(std::vector<size_t> sizes, uint32_t vocab = 1000) {
    dir = fs::temp_directory_path() / ("jtok_test_loader_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(dir);
    size_t g = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<int32_t> t(sizes[k]);
      for (auto& x : t) x = int32_t(g++ % 997);
      ShardInfo in;
      in.vocab_size = vocab;
      in.tokenizer = "gpt2";
      std::string p = (dir / ("s_" + std::to_string(k) + ".bin")).string();
      write_shard(p, in, t);
      paths.push_back(p);
    }
  }
  ~Fixture() { fs::remove_all(dir); }
  static int& counter() { static int c = 0; return c; }
};
void expect_shifted(const Batch& b) {
  for (int r = 0; r < b.B; ++r)
    for (int t = 0; t + 1 < b.T; ++t) EXPECT_EQ(b.targets[r * b.T + t], b.inputs[r * b.T + t + 1]);
  for (int r = 0; r < b.B; ++r)  // fixture tokens count up by one (mod 997)
    EXPECT_EQ(b.targets[r * b.T + b.T - 1], (b.inputs[r * b.T + b.T - 1] + 1) % 997);
}
}  // namespace

TEST(Loader, RandomDeterministicAndResumable) {
  Fixture f({5000, 3000, 100});
  LoaderOptions o;
  o.seed = 42;
  DataLoader a(f.paths, o), b(f.paths, o);
  std::vector<Batch> first;
  for (int i = 0; i < 5; ++i) {
    Batch x = a.next_batch(4, 64), y = b.next_batch(4, 64);
    EXPECT_EQ(x.inputs, y.inputs);
    expect_shifted(x);
    first.push_back(x);
  }
  LoaderState s = a.state();
  EXPECT_EQ(s.step, 5u);
  Batch next = a.next_batch(4, 64);
  // Resume through JSON in a fresh loader.
  DataLoader c(f.paths, o);
  c.restore(loader_state_from_json(nlohmann::json::parse(to_json(s).dump())));
  EXPECT_EQ(c.next_batch(4, 64).inputs, next.inputs);
  // Another seed gives other windows.
  o.seed = 43;
  DataLoader d(f.paths, o);
  EXPECT_NE(d.next_batch(4, 64).inputs, first[0].inputs);
}

// peek_inputs gives the inputs the next batches will have and leaves the position alone (random and
// sequential modes; the sequential one crosses a shard boundary).
TEST(Loader, PeekGivesTheNextBatchesWithoutConsumingThem) {
  Fixture f({5000, 300, 100});
  for (const char* mode : {"random", "sequential"}) {
    LoaderOptions o;
    o.seed = 7;
    o.mode = mode;
    DataLoader a(f.paths, o);
    a.next_batch(2, 64);
    const LoaderState before = a.state();
    const std::vector<int32_t> peeked = a.peek_inputs(40, 2, 64);
    EXPECT_EQ(a.state(), before) << mode;
    ASSERT_EQ(peeked.size(), 40u * 2 * 64);
    for (int i = 0; i < 40; ++i) {
      const Batch b = a.next_batch(2, 64);
      EXPECT_TRUE(std::equal(b.inputs.begin(), b.inputs.end(), peeked.begin() + i * 2 * 64)) << mode << " batch " << i;
    }
  }
}

TEST(Loader, SequentialWrapsAndResumes) {
  Fixture f({300, 201});
  LoaderOptions o;
  o.mode = "sequential";
  DataLoader a(f.paths, o);
  Batch b0 = a.next_batch(2, 100);  // rows at shard 0 offsets 0, 100
  EXPECT_EQ(b0.inputs[0], 0);
  EXPECT_EQ(b0.inputs[100], 100);
  expect_shifted(b0);
  Batch b1 = a.next_batch(2, 100);  // 200 + 101 > 300 -> shard 1 offsets 0, 100
  EXPECT_EQ(b1.inputs[0], 300);
  EXPECT_EQ(b1.inputs[100], 400);
  LoaderState s = a.state();
  Batch b2 = a.next_batch(2, 100);  // shard 1 exhausted -> wraps to shard 0, epoch 1
  EXPECT_EQ(a.state().epoch, 1u);
  EXPECT_EQ(b2.inputs, b0.inputs);
  DataLoader c(f.paths, o);
  c.restore(s);
  EXPECT_EQ(c.next_batch(2, 100).inputs, b2.inputs);
  EXPECT_THROW(c.restore(LoaderState{}), Error);  // mode mismatch
}

TEST(Loader, ValidationSetIsFixed) {
  Fixture f({1000, 550});
  LoaderOptions o;
  ValidationSet v(f.paths, o, 3, 100);
  // windows: shard0 offsets 0..800 (9), shard1 0..400 (5) -> 14 windows -> 4 batches of 3
  EXPECT_EQ(v.num_batches(), 4u);
  Batch b = v.batch(3);
  EXPECT_EQ(b.inputs[0], (1000 + 0) % 997);
  expect_shifted(b);
  EXPECT_EQ(v.batch(1).inputs, ValidationSet(f.paths, o, 3, 100).batch(1).inputs);
  EXPECT_THROW(v.batch(4), Error);
}

TEST(Loader, TokenIdOutsideModelVocabNamesShard) {
  Fixture f({2000});
  LoaderOptions o;
  o.mode = "sequential";
  o.vocab_size = 500;  // fixture tokens go up to 996
  try {
    // The header says vocab 1000 > 500: refused at open, naming the shard.
    DataLoader a(f.paths, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(f.paths[0]), std::string::npos) << e.what();
  }
}

TEST(Loader, TokenIdCheckedPerBatch) {
  // A hand-edited shard whose header claims vocab 500 but holds ids up to 996: opening passes
  // the header check, reading a batch finds the bad id and names the shard.
  Fixture f({2000}, 1000);
  {
    std::fstream fh(f.paths[0], std::ios::in | std::ios::out | std::ios::binary);
    uint32_t v = 500;
    fh.seekp(20);
    fh.write(reinterpret_cast<const char*>(&v), 4);
  }
  LoaderOptions o;
  o.mode = "sequential";
  o.vocab_size = 500;
  DataLoader a(f.paths, o);
  try {
    a.next_batch(1, 800);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(f.paths[0]), std::string::npos) << m;
    EXPECT_NE(m.find("500"), std::string::npos) << m;
  }
}

TEST(Loader, MixedTokenizersRefused) {
  Fixture f({300});
  ShardInfo in;
  in.vocab_size = 151669;
  in.tokenizer = "qwen3";
  std::string p = (f.dir / "z.bin").string();
  write_shard(p, in, {1, 2, 3});
  LoaderOptions o;
  try {
    ShardSet s({f.paths[0], p}, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
  o.tokenizer = "qwen3";
  EXPECT_THROW(ShardSet({f.paths[0]}, o), Error);
}

TEST(Loader, StateJsonErrors) {
  EXPECT_THROW(loader_state_from_json(nlohmann::json::parse(R"({"mode":"random"})")), Error);
  EXPECT_THROW(loader_state_from_json(nlohmann::json::parse(
                   R"({"mode":"x","seed":0,"step":0,"shard":0,"offset":0,"epoch":0})")), Error);
  // The counters are unsigned: 2^64 - 1 is a value, -1 is an error (not wrapped to 2^64 - 1), and so
  // is a float.
  const LoaderState top = loader_state_from_json(nlohmann::json::parse(
      R"({"mode":"random","seed":18446744073709551615,"step":0,"shard":0,"offset":0,"epoch":0})"));
  EXPECT_EQ(top.seed, UINT64_MAX);
  EXPECT_EQ(loader_state_from_json(to_json(top)), top);
  for (const char* bad : {R"({"mode":"random","seed":-1,"step":0,"shard":0,"offset":0,"epoch":0})",
                          R"({"mode":"random","seed":0,"step":1.0,"shard":0,"offset":0,"epoch":0})"}) {
    try {
      loader_state_from_json(nlohmann::json::parse(bad));
      ADD_FAILURE() << "no error for " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("must be a non-negative integer"), std::string::npos) << e.what();
    }
  }
}
