// The token tables' optimizer work on side streams (train config table_streams, cuda/table_streams.h)
// against the same trainer on one stream: a dense + JTok + JTok-M model (JTok-M on every layer, JTok
// on layer 1) through 3 steps with an evaluation after each, in the "dense" (deferred), "sparse" and
// "dense-eager" table modes, fp32 and bf16: every loss, evaluation loss and gradient norm bitwise
// equal, then the downloaded weights, tables and moments byte for byte, and the rows caught up (the
// trainer's replay counts: some warm rows under "dense", none under "sparse"). On the CPU's
// emulation with EMU_STREAMS=lazy (the CI set's second run) a stream's work runs only when something
// waits for it, so a missing wait reads stale rows and changes these bits. And the streams' runs: each layer's
// tables as runs of consecutive tables, a table read by two layers refused. Runs on a GPU host (in
// test_cuda_ops; bash scripts/test_cuda.sh) and on the emulation (tests/cuda/emulate_kernels.sh).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/table_streams.h"
#include "cuda/training.h"
#include "model_case.h"
#include "step_case.h"
#include "train/optimizer.h"
#include "train/tables_cuda.h"

namespace {

using namespace jtok::cuda_test;

struct RunResult {
  std::vector<double> losses, evals, norms;
  std::vector<float> params, m, v;
  std::vector<std::vector<float>> tables, table_m, table_v;
  jtok::cuda::DeviceTrainer::ReplayCounts replayed;  // after the download's sync
};

RunResult run_trainer(const jtok::ModelConfig& c, const std::string& mode, bool bf16, bool streams) {
  jtok::TrainConfig t = ten_steps();
  t.table_optimizer = mode;
  t.table_learning_rate = 1e-2;
  jtok::Model m = test_model(c);
  jtok::AdamWState state = jtok::make_adamw_state(m);
  const auto dev = jtok::cuda::make_device_trainer(m, jtok::host_adamw_view(state), bf16,
                                                   {mode != "sparse", mode == "dense-eager", true, streams});
  RunResult r;
  for (uint64_t s = 0; s < 3; ++s) {
    const Batch b = make_batch(c, 9100 + s), e = make_batch(c, 9200 + s);
    dev->zero_grads();
    r.losses.push_back(dev->forward_backward(b.ids.data(), b.targets.data(), b.B, b.T, 1.0f, false).loss);
    r.norms.push_back(jtok::device_optimizer_step(*dev, state, t).grad_norm);
    r.evals.push_back(dev->eval_loss(e.ids.data(), e.targets.data(), e.B, e.T));  // its row syncs, then the next step's
  }
  const jtok::cuda::HostAdamWView view = jtok::host_adamw_view(state);
  dev->download(m, &view);
  EXPECT_TRUE(dev->replay_counts(r.replayed));
  r.params.assign(m.params.begin(), m.params.end());
  r.m = state.m;
  r.v = state.v;
  for (size_t k = 0; k < m.tables.size(); ++k) {
    r.tables.push_back(m.tables[k].to_vector());
    r.table_m.push_back(state.tables.m[k]);
    r.table_v.push_back(state.tables.v[k]);
  }
  return r;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The losses, norms, weights, tables and moments of two runs, bit for bit.
void expect_same_values(const std::string& at, const RunResult& one, const RunResult& side) {
  EXPECT_EQ(one.losses, side.losses) << at;
  EXPECT_EQ(one.evals, side.evals) << at;
  EXPECT_EQ(one.norms, side.norms) << at;
  EXPECT_TRUE(same_bytes(one.params, side.params)) << at << ": weights";
  EXPECT_TRUE(same_bytes(one.m, side.m) && same_bytes(one.v, side.v)) << at << ": moments";
  ASSERT_EQ(one.tables.size(), side.tables.size()) << at;
  for (size_t k = 0; k < one.tables.size(); ++k) {
    EXPECT_TRUE(same_bytes(one.tables[k], side.tables[k])) << at << ": table " << k;
    EXPECT_TRUE(same_bytes(one.table_m[k], side.table_m[k]) && same_bytes(one.table_v[k], side.table_v[k]))
        << at << ": table " << k << "'s moments";
  }
}

// And the same rows caught up.
void expect_same_run(const std::string& at, const RunResult& one, const RunResult& side) {
  expect_same_values(at, one, side);
  EXPECT_EQ(one.replayed.rows, side.replayed.rows) << at << ": the same rows caught up";
  EXPECT_EQ(one.replayed.warm_rows, side.replayed.warm_rows) << at;
  EXPECT_EQ(one.replayed.warm_steps, side.replayed.warm_steps) << at;
  EXPECT_EQ(one.replayed.stepped_rows, side.replayed.stepped_rows) << at;
}

TEST(CudaTableStreams, SideStreamsGiveTheOneStreamBits) {
  const jtok::ModelConfig c = tiny_jtok_jtokm();
  const std::vector<std::pair<std::string, bool>> cases = {
      {"dense", false}, {"dense", true}, {"sparse", false}, {"dense-eager", true}};
  for (const auto& [mode, bf16] : cases) {
    const std::string at = mode + (bf16 ? " bf16" : " fp32");
    const RunResult one = run_trainer(c, mode, bf16, false), side = run_trainer(c, mode, bf16, true);
    ASSERT_FALSE(one.tables.empty());
    if (mode == "sparse")
      EXPECT_EQ(one.replayed.rows, 0) << at << ": nothing deferred";
    else
      EXPECT_GT(one.replayed.warm_rows, 0) << at << ": rows behind were caught up, warm ones among them";
    expect_same_run(at, one, side);
  }
}

// dense-eager (every table row brought current after each step: the naive optimizer's cost) moves the
// rows at other times than the deferred dense AdamW, by the same per-step arithmetic: the same bits.
TEST(CudaTableStreams, EagerSyncGivesTheDeferredBits) {
  const jtok::ModelConfig c = tiny_jtok_jtokm();
  for (bool bf16 : {false, true}) {
    const RunResult deferred = run_trainer(c, "dense", bf16, false), eager = run_trainer(c, "dense-eager", bf16, false);
    EXPECT_GT(eager.replayed.rows, deferred.replayed.rows) << "the eager pass moves every row every step";
    expect_same_values(bf16 ? "dense-eager bf16" : "dense-eager fp32", deferred, eager);
  }
}

TEST(CudaTableStreams, EachLayersTablesAreRunsOfConsecutiveTables) {
  using Run = jtok::cuda::TableStreams::Run;
  auto runs_of = [](const std::vector<int>& jtok, const std::vector<int>& jtokm, int64_t n_e, int64_t n) {
    const jtok::cuda::TableStreams streams(jtok, jtokm, n_e, n, 16);
    std::vector<std::vector<int64_t>> got;
    for (const Run& r : streams.runs()) got.push_back({r.layer, r.k0, r.k1});
    return got;
  };
  // Layer 0: JTok's table 0, JTok-M's 1 and 2; layer 1 none; layer 2: 5, then 6 and 7.
  EXPECT_EQ(runs_of({0, -1, 5}, {1, -1, 6}, 2, 8), (std::vector<std::vector<int64_t>>{{0, 0, 3}, {2, 5, 8}}));
  // JTok's table apart from its layer's JTok-M tables: two runs of one layer.
  EXPECT_EQ(runs_of({4, -1}, {0, 2}, 2, 5), (std::vector<std::vector<int64_t>>{{0, 0, 2}, {0, 4, 5}, {1, 2, 4}}));
  EXPECT_THROW(jtok::cuda::TableStreams({0, 0}, {-1, -1}, 1, 1, 16), jtok::Error);  // one table, two layers
}

}  // namespace
