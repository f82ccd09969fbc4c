// The deferred table AdamW (cuda/table_adamw.h) over the step's touched-row list (cuda/table_rows.h)
// against src/train/table_optimizer.cpp's TableOptimizer (tests/cuda/cuda_case.h). Part of
// test_cuda_ops; also compiled unchanged by tests/cuda/emulate_kernels.sh (no GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>

#include "cuda/table_adamw.h"
#include "cuda/table_rows.h"
#include "cuda_case.h"
#include "model/token_table.h"
#include "ops/adamw.h"
#include "train/table_optimizer.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

// The table AdamW's run: five steps, each with gradients at a different third of the rows (some
// rows wait several steps; row 0 never gets one), a reader's sync of a few rows after step 3, then
// sync_all. Dense (deferred, exact) semantics, or lazy (the rows with a gradient only, nothing
// replayed: the syncs change nothing). Outputs: values, moments, row steps and the catch-up
// statistics after step 5 and after the sync; the bf16 copy equals the GPU's own values rounded
// (expect_bf16_copy).
struct TableAdamwRun {
  static constexpr int64_t V = 64, d = 40, steps = 5;
  bool dense = true;
  // TableGrad::zero_rows: the used gradient rows zeroed (the rows not flagged are zero, as the
  // backward's atomics need); else left as they are (the rows not flagged hold stale values: NaN here,
  // which no step may read).
  bool zero_rows = false;
  std::vector<float> p0 = randn(V * d, 111, 0.5f), grads = randn(steps * V * d, 113);
  std::vector<std::vector<int32_t>> touched_ids;
  std::vector<int32_t> read_ids = {1, 2, 5, 7, 11};
  // The sync's subset of read_ids (RowSubset, bit 1): rows 1, 5, 11 only; empty: all of them.
  std::vector<uint32_t> read_bits;
  static constexpr int kReadBit = 1;
  bool read(size_t i) const { return read_bits.empty() || (read_bits[i] >> kReadBit & 1u); }

  TableAdamwRun() : touched_ids(steps) {
    std::mt19937_64 rng(112);
    for (int64_t k = 0; k < steps; ++k)
      for (int32_t r = 1; r < V; ++r)
        if (rng() % 3 == 0) touched_ids[k].push_back(r);
  }
  static jtok::AdamWHyper hyper(int64_t step) { return {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.8f}; }
  static Outputs state(const std::string& at, std::vector<float> p, std::vector<float> m, std::vector<float> v,
                       const std::vector<int32_t>& row_step, const std::vector<double>& stats) {
    return Outputs{{"p " + at, std::move(p)}, {"m " + at, std::move(m)}, {"v " + at, std::move(v)},
                   {"row_step " + at, std::vector<float>(row_step.begin(), row_step.end())},
                   {"stats " + at, std::vector<float>(stats.begin(), stats.end())}};
  }

  // src/train/table_optimizer.cpp's TableOptimizer.
  Outputs cpu(DType t) const {
    const auto gt = to_dtype(grads, t);
    std::vector<jtok::TokenTable> tables = {jtok::TokenTable::in_ram(V, d, p0)};
    std::vector<jtok::SparseRowGrad> g(1);
    g[0].init(V, d);
    jtok::TableMoments st = jtok::make_table_moments(tables, true, 0);
    jtok::TableOptimizer opt(tables, g, st);
    auto snapshot = [&](const std::string& at) {
      const float* p = tables[0].mutable_row(0);
      return state(at, std::vector<float>(p, p + V * d), st.m[0], st.v[0], st.row_step[0],
                   {double(st.replayed_rows), double(st.replayed_warm_rows), double(st.replayed_warm_steps),
                    double(st.stepped_rows), 0.0});
    };
    for (int64_t k = 0; k < steps; ++k) {
      for (int32_t r : touched_ids[k]) std::copy_n(gt.begin() + (k * V + r) * d, d, g[0].row(r));
      opt.step(hyper(k + 1), dense);
      g[0].clear();
      if (k == 2)
        for (size_t i = 0; i < read_ids.size(); ++i)
          if (read(i)) opt.sync_row(0, read_ids[i]);
    }
    Outputs o = snapshot("after step 5");
    opt.sync_all();
    for (auto& x : snapshot("after sync")) o.push_back(std::move(x));
    return o;
  }

  // Step k's gradient as the device takes it: a table-shaped gradient and the touched flags, listed
  // by the compaction (cuda/table_rows.h) as the model's step lists them (checked: touched_ids[k]).
  void upload_step(int64_t k, const std::vector<float>& gt, float* dg, uint8_t* touched, DeviceBuffer<int32_t>& rows,
                   DeviceBuffer<int32_t>& count) const {
    std::vector<float> gk(V * d, zero_rows ? 0.0f : std::numeric_limits<float>::quiet_NaN());
    std::vector<uint8_t> flags(V, 0);
    for (int32_t r : touched_ids[k]) {
      std::copy_n(gt.begin() + (k * V + r) * d, d, gk.begin() + r * d);
      flags[r] = 1;
    }
    JTOK_CUDA_CHECK(cudaMemcpy(dg, gk.data(), gk.size() * 4, cudaMemcpyHostToDevice));
    JTOK_CUDA_CHECK(cudaMemcpy(touched, flags.data(), V, cudaMemcpyHostToDevice));
    DeviceBuffer<char> scratch(jtok::cuda::touched_rows_scratch_bytes(V));
    jtok::cuda::select_touched_rows(rows.get(), count.get(), touched, V, scratch.get(), scratch.n, nullptr);
    const auto listed = download_exact(rows);
    ASSERT_EQ(download_exact(count)[0], static_cast<int32_t>(touched_ids[k].size())) << "step " << k + 1;
    EXPECT_TRUE(std::equal(touched_ids[k].begin(), touched_ids[k].end(), listed.begin())) << "step " << k + 1;
  }

  Outputs gpu(DType t) const {
    const auto gt = to_dtype(grads, t);
    auto dp = upload<float>(p0), dm = upload<float>(std::vector<float>(V * d)), dv = upload<float>(std::vector<float>(V * d));
    auto steps_d = upload_exact(std::vector<int32_t>(V, 0));
    auto dg = upload<float>(std::vector<float>(V * d)), scale = upload<float>({0.8f});
    auto dids = upload_exact(read_ids);
    auto dbits = upload_exact(read_bits.empty() ? std::vector<uint32_t>(1) : read_bits);
    auto pb = upload<__nv_bfloat16>(p0);  // the copy starts as the values rounded (lazy: row 0 never written)
    DeviceBuffer<uint8_t> touched(V);
    DeviceBuffer<int32_t> rows(V), count(1);
    DeviceBuffer<jtok::cuda::AdamWConsts> consts(steps);
    DeviceBuffer<unsigned long long> counters(jtok::cuda::kTableStats);
    counters.zero();
    const jtok::cuda::DeviceTable tab{dp.get(), pb.get(), dm.get(), dv.get(), steps_d.get(), V, d};
    const jtok::cuda::TableStats stats{counters.get()};
    auto snapshot = [&](const std::string& at) {
      const auto cnt = download_exact(counters);
      return state(at, download(dp), download(dm), download(dv), download_exact(steps_d),
                   {double(cnt[0]), double(cnt[1]), double(cnt[2]), double(cnt[3]), double(cnt[4])});
    };
    std::vector<jtok::cuda::AdamWConsts> kept;
    for (int64_t k = 0; k < steps; ++k) {
      upload_step(k, gt, dg.get(), touched.get(), rows, count);
      const jtok::AdamWStepConsts h = jtok::adamw_consts(hyper(k + 1));
      kept.push_back({h.b1, h.b2, h.eps, h.step_size, h.inv_sqrt_bc2, h.decay});
      JTOK_CUDA_CHECK(cudaMemcpy(consts.get(), kept.data(), kept.size() * sizeof(kept[0]), cudaMemcpyHostToDevice));
      // Dense keeps every step's constants from step 1; lazy only this step's, dropped after it.
      const jtok::cuda::KeptConsts kc = dense ? jtok::cuda::KeptConsts{consts.get(), 0, k + 1}
                                              : jtok::cuda::KeptConsts{consts.get() + k, k, k + 1};
      const jtok::cuda::KeptConsts after = dense ? kc : jtok::cuda::KeptConsts{consts.get() + k, k + 1, k + 1};
      jtok::cuda::table_adamw_step(tab, {dg.get(), touched.get(), zero_rows}, rows.get(), count.get(), V, kc, k + 1,
                                   dense, scale.get(), stats, nullptr);
      if (k == 2)
        jtok::cuda::table_sync_rows(tab, dids.get(), nullptr, static_cast<int64_t>(read_ids.size()), after, stats,
                                    nullptr, {read_bits.empty() ? nullptr : dbits.get(), kReadBit});
    }
    Outputs o = snapshot("after step 5");
    const jtok::cuda::KeptConsts all = dense ? jtok::cuda::KeptConsts{consts.get(), 0, steps}
                                             : jtok::cuda::KeptConsts{consts.get() + steps, steps, steps};
    jtok::cuda::table_sync_all(tab, all, stats, nullptr);
    for (auto& x : snapshot("after sync")) o.push_back(std::move(x));
    expect_bf16_copy(download(pb), download(dp));
    expect_gradient_after(download(dg), t);
    const auto flags_after = download_exact(touched);
    EXPECT_EQ(std::count(flags_after.begin(), flags_after.end(), uint8_t{0}), V) << "the used flags are cleared";
    return o;
  }

  // zero_rows: every row zero; else the last step's rows as they were uploaded (bits), the rest NaN.
  void expect_gradient_after(const std::vector<float>& g, DType t) const {
    if (zero_rows) {
      EXPECT_EQ(std::count(g.begin(), g.end(), 0.0f), V * d) << "the used gradient rows are zeroed";
      return;
    }
    const auto gt = to_dtype(grads, t);
    std::vector<uint8_t> last(V, 0);
    for (int32_t r : touched_ids[steps - 1]) last[static_cast<size_t>(r)] = 1;
    int64_t kept = 0, stale = 0;
    for (int64_t r = 0; r < V; ++r)
      for (int64_t j = 0; j < d; ++j) {
        const float x = g[static_cast<size_t>(r * d + j)];
        if (last[static_cast<size_t>(r)])
          kept += std::memcmp(&x, &gt[static_cast<size_t>(((steps - 1) * V + r) * d + j)], 4) == 0;
        else
          stale += std::isnan(x);
      }
    const int64_t n_last = static_cast<int64_t>(touched_ids[steps - 1].size());
    EXPECT_EQ(kept, n_last * d) << "the used gradient rows are left as they were";
    EXPECT_EQ(stale, (V - n_last) * d) << "the other rows are not written";
  }
};

// The table AdamW against the CPU's TableOptimizer (TableAdamwRun), dense and lazy: every output
// within fp32 rounding (the same arithmetic; GCC may fuse the CPU's), the statistics exactly. Dense
// also with the sync given a subset of its rows (JTok-M's chosen pairs): the others stay behind.
TEST(CudaOps, TableAdamw) {
  struct Mode {
    bool dense, zero_rows, subset;
  };
  for (const Mode mode : {Mode{true, false, false}, {true, true, false}, {false, false, false}, {true, false, true}}) {
    TableAdamwRun run;
    run.dense = mode.dense;
    run.zero_rows = mode.zero_rows;
    if (mode.subset) run.read_bits = {0b10, 0b01, 0b11, 0b00, 0b110};
    CudaCase c{std::string(mode.dense ? "table_adamw" : "table_adamw lazy") + (mode.zero_rows ? " zero rows" : "") +
                   (mode.subset ? " subset" : ""),
               "V 64, d 40, 5 steps, sync",
               {1e-6, 1e-6}};
    c.cpu = [&](DType t) { return run.cpu(t); };
    c.gpu = [&](DType t) { return run.gpu(t); };
    run_case(c);
    expect_deterministic(c, DType::f32);
  }
}

}  // namespace
