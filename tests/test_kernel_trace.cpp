// The kernel trace's host side (src/cuda/kernel_trace.h): its CSV, its walk of CUPTI's activity
// records (a buffer of CUPTI's own record types, walked by the toolkit's libcupti: no GPU needed),
// and a start that says why it cannot trace where there is no GPU. Plain C++: runs here, and in the
// build without CUDA, where the walk refuses naming the build.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/device.h"
#include "cuda/kernel_trace.h"

namespace {

using jtok::cuda::TraceRecord;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(KernelTrace, CsvQuotesNamesAndKeepsEveryRecord) {
  const std::vector<TraceRecord> records = {
      {"kernel", 7, 1000, 1250, "void jtok::cuda::attn_fwd_mma<64>(bf16*, float*, AttnDims, float)"},
      {"memcpy HtoD", 13, 1300, 2300, "65536 bytes"},
      {"kernel", 7, 2400, 2410, "say \"hi\""}};
  const std::string csv = jtok::cuda::trace_csv(records, "steps 3, models base");
  EXPECT_EQ(csv,
            "# steps 3, models base\n"
            "kind,stream,start_ns,end_ns,name\n"
            "kernel,7,1000,1250,\"void jtok::cuda::attn_fwd_mma<64>(bf16*, float*, AttnDims, float)\"\n"
            "memcpy HtoD,13,1300,2300,\"65536 bytes\"\n"
            "kernel,7,2400,2410,\"say \"\"hi\"\"\"\n");
}

TEST(KernelTrace, WalksKernelCopyAndMemsetRecords) {
  const std::vector<TraceRecord> records = {{"kernel", 7, 100, 350, "_ZN4jtok4cuda11rmsnorm_fwdEv"},
                                            {"memcpy HtoD", 9, 400, 900, "4096 bytes"},
                                            {"memset", 7, 950, 960, "512 bytes"},
                                            {"kernel", 14, 1000, 1001, "plain_c_kernel"}};
  if (!jtok::cuda::built_with_cuda()) {  // the CPU-only build (the sanitizers'): refused, naming why
    try {
      jtok::cuda::activity_records_for_test(records);
      FAIL() << "a build without CUDA walked CUPTI records";
    } catch (const jtok::Error& e) {
      EXPECT_TRUE(has(e.what(), "built without CUDA")) << e.what();
    }
    return;
  }
  std::vector<uint8_t> buf = jtok::cuda::activity_records_for_test(records);
  std::vector<TraceRecord> got;
  jtok::cuda::parse_activity_records(buf.data(), buf.size(), got);
  ASSERT_EQ(got.size(), records.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].kind, records[i].kind) << i;
    EXPECT_EQ(got[i].stream, records[i].stream) << i;
    EXPECT_EQ(got[i].start_ns, records[i].start_ns) << i;
    EXPECT_EQ(got[i].end_ns, records[i].end_ns) << i;
  }
  EXPECT_EQ(got[0].name, "jtok::cuda::rmsnorm_fwd()");  // demangled
  EXPECT_EQ(got[1].name, "4096 bytes");
  EXPECT_EQ(got[2].name, "512 bytes");
  EXPECT_EQ(got[3].name, "plain_c_kernel");  // not a C++ name: as it came
}

TEST(KernelTrace, StartWithoutAGpuSaysWhy) {
  bool gpu = true;
  try {
    jtok::cuda::require_cuda_device();
  } catch (const jtok::Error&) {
    gpu = false;
  }
  const std::string why = jtok::cuda::kernel_trace_start();
  if (gpu) {  // a GPU host: a real trace, with nothing run in it
    ASSERT_EQ(why, "");
    EXPECT_TRUE(jtok::cuda::kernel_trace_stop().empty());
    return;
  }
  std::printf("kernel trace off a GPU: %s\n", why.c_str());
  EXPECT_TRUE(has(why, jtok::cuda::built_with_cuda() ? "CUPTI" : "built without CUDA")) << why;
  EXPECT_TRUE(jtok::cuda::kernel_trace_stop().empty());
}

}  // namespace
