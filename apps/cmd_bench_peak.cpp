// `jtok bench-peak`: this machine's fp32 FMA peak and oneDNN sgemm GFLOP/s on a transformer-shaped
// product (4096 x 768 @ 768 x 3072), for MFU denominators; and its memory bandwidth, STREAM's
// triad a = b + s * c over three 32M-float arrays (384 MiB, far beyond the caches) with the
// OpenMP threads, best of 5, counting 3 x 4 bytes per element as STREAM does: the denominator of
// memory-bound decode (bench/serve_throughput.sh).
#include <omp.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/peak_flops.h"
#include "ops/gemm_rate.h"

namespace cmd_bench_peak {

void run() {
  const double peak = jtok::measure_peak_gflops(1.0);
  const double best = jtok::measure_sgemm_gflops();
  const jtok::TriadRate triad = jtok::measure_triad();
  if (!triad.checked) std::fprintf(stderr, "bench-peak: triad check failed\n");
  nlohmann::json j = {{"threads", omp_get_max_threads()}, {"fma_peak_gflops", peak}, {"sgemm_gflops", best},
                      {"sgemm_fraction_of_peak", best / peak}, {"isa", jtok::simd_isa()}, {"triad_gbs", triad.gbs}};
  std::printf("%s\n", j.dump().c_str());
}

void setup(CLI::App* sub) { sub->callback(run); }

const bool registered = jtok::register_command({"bench-peak", "measure the fp32 FMA peak, sgemm GFLOP/s and the memory bandwidth (STREAM triad)", setup});

}  // namespace cmd_bench_peak
