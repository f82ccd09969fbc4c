// `jtok bench-peak`: this machine's fp32 FMA peak and oneDNN sgemm GFLOP/s on a transformer-shaped
// product (4096 x 768 @ 768 x 3072), for MFU denominators; and its memory bandwidth, STREAM's
// triad a = b + s * c over three 32M-float arrays (384 MiB, far beyond the caches) with the
// OpenMP threads, best of 5, counting 3 x 4 bytes per element as STREAM does: the denominator of
// memory-bound decode (bench/serve_throughput.sh).
// `--device cuda`: the GPU's (cuda/device_peak.h): cuBLASLt's bf16 products at the reference square
// 8192^3 and at config b's shapes for 16 x 1024 tokens a step, each checked; device memory's copy
// bandwidth; pinned host <-> device copies.
#include <omp.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "core/peak_flops.h"
#include "cuda/device.h"
#include "cuda/device_peak.h"
#include "ops/gemm_rate.h"

namespace cmd_bench_peak {

struct Args {
  std::string device = "cpu";
  std::vector<std::string> products;  // "M,N,K"
  int64_t copy_mb = 1024;
  int reps = 10;
};

void run_cpu() {
  const double peak = jtok::measure_peak_gflops(1.0);
  const double best = jtok::measure_sgemm_gflops();
  const jtok::TriadRate triad = jtok::measure_triad();
  if (!triad.checked) std::fprintf(stderr, "bench-peak: triad check failed\n");
  nlohmann::json j = {{"threads", omp_get_max_threads()}, {"fma_peak_gflops", peak}, {"sgemm_gflops", best},
                      {"sgemm_fraction_of_peak", best / peak}, {"isa", jtok::simd_isa()}, {"triad_gbs", triad.gbs}};
  std::printf("%s\n", j.dump().c_str());
}

struct NamedShape {
  std::string name;
  std::array<int64_t, 3> mnk;
};

// Config b (configs/bench_b.json: d 768, FFN 3072, vocab 50304) at 16 x 1024 tokens: its forward's
// products, x (tokens, in) times W (out, in) transposed; and the 8192^3 square datasheets quote.
std::vector<NamedShape> default_shapes() {
  const int64_t t = 16 * 1024, d = 768;
  return {{"square 8192", {8192, 8192, 8192}},   {"config b q|k|v", {t, 3 * d, d}},
          {"config b attention out", {t, d, d}}, {"config b gate|up", {t, 2 * 3072, d}},
          {"config b down", {t, d, 3072}},       {"config b lm head", {t, 50304, d}}};
}

NamedShape parse_shape(const std::string& s) {
  std::array<int64_t, 3> v{};
  char c1 = 0, c2 = 0;
  std::istringstream in(s);
  in >> v[0] >> c1 >> v[1] >> c2 >> v[2];
  if (!(in && c1 == ',' && c2 == ',' && in.peek() == EOF && v[0] > 0 && v[1] > 0 && v[2] > 0))
    jtok::fail("bench-peak: --product '", s, "' is not M,N,K (three positive sizes)");
  return {s, v};
}

void run_cuda(const Args& a) {
  if (a.copy_mb < 0) jtok::fail("bench-peak: --copy-mb ", a.copy_mb, " is negative");
  std::vector<NamedShape> shapes;
  for (const std::string& s : a.products) shapes.push_back(parse_shape(s));  // refused before any GPU is asked
  if (shapes.empty()) shapes = default_shapes();
  std::vector<std::array<int64_t, 3>> mnk;
  for (const NamedShape& s : shapes) mnk.push_back(s.mnk);
  const jtok::cuda::DeviceInfo d = jtok::cuda::require_cuda_device();
  std::fprintf(stderr, "bench-peak: %s\n", jtok::cuda::describe(d).c_str());
  const jtok::cuda::DevicePeaks p = jtok::cuda::measure_device_peaks(mnk, a.copy_mb << 20, a.reps);
  nlohmann::json products = nlohmann::json::array();
  for (size_t i = 0; i < p.products.size(); ++i) {
    const jtok::cuda::PeakProduct& q = p.products[i];
    const double frac = d.bf16_peak_tflops > 0 ? q.tflops / d.bf16_peak_tflops : 0;
    const bool named = a.products.empty();  // the default shapes: their names too
    std::fprintf(stderr, "bench-peak: bf16 product %lld x %lld x %lld%s%s%s: %.3f ms, %.1f TFLOP/s (%.0f %% of %.0f)\n",
                 static_cast<long long>(q.M), static_cast<long long>(q.N), static_cast<long long>(q.K),
                 named ? " (" : "", named ? shapes[i].name.c_str() : "", named ? ")" : "", q.ms, q.tflops, 100 * frac,
                 d.bf16_peak_tflops);
    products.push_back({{"name", shapes[i].name},
                        {"M", q.M},
                        {"N", q.N},
                        {"K", q.K},
                        {"ms", q.ms},
                        {"tflops", q.tflops},
                        {"fraction_of_peak", frac},
                        {"max_rel_error", q.max_rel_error}});
  }
  const nlohmann::json j = {{"device", "cuda"},
                            {"gpu", d.name},
                            {"describe", jtok::cuda::describe(d)},
                            {"bf16_peak_tflops", d.bf16_peak_tflops},
                            {"peak_how", d.peak_how},
                            {"reps", a.reps},
                            {"products", products},
                            {"copy_mb", a.copy_mb},
                            {"device_copy_gbs", p.device_copy_gbs},
                            {"h2d_gbs", p.h2d_gbs},
                            {"d2h_gbs", p.d2h_gbs}};
  std::printf("%s\n", j.dump().c_str());
}

void setup(CLI::App* sub) {
  auto a = std::make_shared<Args>();
  sub->add_option("--device", a->device,
                  "cpu (default): FMA peak, sgemm, STREAM triad; cuda: the GPU's bf16 "
                  "products, device and pinned host copies")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--product", a->products,
                  "cuda: a bf16 product M,N,K to time, x (M,K) by W (N,K) transposed (repeatable; default: 8192^3 "
                  "and config b's at 16 x 1024 tokens)");
  sub->add_option("--copy-mb", a->copy_mb, "cuda: each copy's MiB (default 1024; 0: no copies)");
  sub->add_option("--reps", a->reps, "cuda: timed calls of each, the best kept (default 10)")
      ->check(CLI::PositiveNumber);
  sub->callback([a] {
    if (a->device == "cuda")
      run_cuda(*a);
    else {
      if (!a->products.empty()) jtok::fail("bench-peak: --product is for --device cuda (the CPU's product is fixed)");
      run_cpu();
    }
  });
}

const bool registered = jtok::register_command({"bench-peak",
                                                "measure the fp32 FMA peak, sgemm GFLOP/s and the memory bandwidth "
                                                "(STREAM triad); --device cuda: the GPU's bf16 products and copies",
                                                setup});

}  // namespace cmd_bench_peak
