// JTOK_KERNEL_TRACE on the GPU (src/cuda/kernel_trace.h: CUPTI's activity records; on the emulated GPU
// the grids it runs, tests/cuda/emu/fake_kernel_trace.cpp): the kernels launched between a start and
// a stop are recorded with their names and ordered spans, nothing after the stop; and bench-decode's
// traced run of each shape (infer/bench_decode.h) writes a file a line whose kernels are that run's,
// with the timed runs' tokens (and no kernel of training's routing statistics). Runs only on a GPU
// host (in test_cuda_ops) and emulated.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cuda/device_array.h"
#include "cuda/kernel_trace.h"
#include "cuda/swiglu.h"
#include "data/shard.h"
#include "infer/bench_decode.h"
#include "model_case.h"

namespace {

using jtok::cuda::TraceRecord;

// The records whose kernel name holds `part`.
int64_t kernels_named(const std::vector<TraceRecord>& records, const std::string& part) {
  int64_t n = 0;
  for (const TraceRecord& r : records) n += r.kind == "kernel" && r.name.find(part) != std::string::npos;
  return n;
}

void launch_swiglu(jtok::cuda::DeviceArray<float>& out, const jtok::cuda::DeviceArray<float>& in, int64_t N) {
  jtok::cuda::swiglu_forward(out.get(), in.get(), in.get() + N * 8, N, 8, 8, nullptr);
}

struct TempDir {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("jtok_kernel_trace_" + std::to_string(::getpid()));
  TempDir() { std::filesystem::create_directories(dir); }
  ~TempDir() { std::filesystem::remove_all(dir); }
};

std::string first_line(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::string line;
  std::getline(f, line);
  return line;
}

}  // namespace

TEST(CudaKernelTrace, RecordsTheKernelsBetweenStartAndStop) {
  const int64_t N = 64;
  jtok::cuda::DeviceArray<float> in(2 * N * 8), out(N * 8);
  in.zero(nullptr);
  ASSERT_EQ(jtok::cuda::kernel_trace_start(), "");
  EXPECT_NE(jtok::cuda::kernel_trace_start(), "") << "a second trace in the same process";
  for (int i = 0; i < 3; ++i) launch_swiglu(out, in, N);
  uint64_t dropped = 99;
  const std::vector<TraceRecord> records = jtok::cuda::kernel_trace_stop(&dropped);
  EXPECT_EQ(dropped, 0u);
  EXPECT_EQ(kernels_named(records, "swiglu_forward"), 3);
  for (const TraceRecord& r : records) EXPECT_LE(r.start_ns, r.end_ns) << r.name;
  launch_swiglu(out, in, N);  // after the stop, and finished before the next start: not recorded anywhere
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(jtok::cuda::kernel_trace_stop().empty());
  ASSERT_EQ(jtok::cuda::kernel_trace_start(), "") << "a trace starts again after a stop";
  launch_swiglu(out, in, N);
  EXPECT_EQ(kernels_named(jtok::cuda::kernel_trace_stop(), "swiglu_forward"), 1);
}

TEST(CudaKernelTrace, BenchDecodeTracesOneMoreRunOfEachShape) {
  const jtok::Model m = jtok::cuda_test::test_model(jtok::cuda_test::tiny_jtokm());
  TempDir t;
  std::vector<int32_t> ids(4096);
  std::mt19937 rng(5);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % m.cfg.vocab_size);
  jtok::ShardInfo info;
  info.vocab_size = static_cast<uint32_t>(m.cfg.vocab_size);
  jtok::write_shard((t.dir / "train_000000.bin").string(), info, ids);
  jtok::BenchDecodeOptions opt;
  opt.device = "cuda";
  opt.settings.page_tokens = 16;
  opt.batches = {1, 2};
  opt.prompt_len = 8, opt.new_tokens = 3, opt.long_prompt = 16, opt.warmup = 0, opt.repeat = 1;
  opt.data = t.dir.string();
  opt.kernel_trace = (t.dir / "k.csv").string();
  const std::vector<nlohmann::json> lines = jtok::bench_decode(m, opt);
  ASSERT_EQ(lines.size(), 3u);
  const std::string rows = lines[0]["table_rows"];
  const std::vector<std::pair<std::string, int64_t>> want = {{"b1", 3}, {"b2", 3}, {"prefill", 1}};
  for (size_t i = 0; i < want.size(); ++i) {
    const nlohmann::json& k = lines[i]["kernel_trace"];
    const std::filesystem::path file = t.dir / ("k-" + rows + "-" + want[i].first + ".csv");
    SCOPED_TRACE(file.string() + ": " + k.dump());
    EXPECT_EQ(k["file"], file.string());
    EXPECT_EQ(k["steps"], want[i].second);
    EXPECT_GT(k["records"].get<int64_t>(), 0);
    if (i < 2) {
      EXPECT_TRUE(k["same_tokens"].get<bool>());
    }
    ASSERT_TRUE(std::filesystem::exists(file));
    EXPECT_NE(first_line(file).find(", steps " + std::to_string(want[i].second) + ", dropped 0"), std::string::npos)
        << first_line(file);
    std::ifstream f(file);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("paged_qkv_kernel"), std::string::npos);  // the layers' and the tables' kernels
    EXPECT_NE(text.find("jtokm_mix_inject_kernel"), std::string::npos);
    EXPECT_EQ(text.find("jtokm_route_stats"), std::string::npos) << "the decoder computes training's statistics";
  }
}
