#include "train/precision.h"

#include <chrono>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "ops/linear.h"

namespace jtok {

nlohmann::json PrecisionReport::to_json() const {
  nlohmann::json j = {{"requested", requested}, {"used", used}};
  if (bf16_gflops > 0) {
    j["bf16_matmul_gflops"] = bf16_gflops;
    j["fp32_matmul_gflops"] = fp32_gflops;
  }
  return j;
}

// GFLOP/s of the best of 3 runs of one (M, N, K) product in the current precision path.
static double matmul_rate(bool bf16) {
  const int64_t M = 1024, N = 768, K = 768;
  std::vector<float> A(M * K, 0.01f), B(N * K, 0.02f), C(M * N);
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {  // the first builds the primitive and warms the caches
    const auto t0 = std::chrono::steady_clock::now();
    if (bf16) gemm_bf16(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);
    else gemm_f32(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, dt);
  }
  return 2.0 * M * N * K / best / 1e9;
}

PrecisionReport apply_training_precision(const std::string& requested) {
  PrecisionReport r;
  r.requested = requested;
  if (requested == "fp32") {
    set_matmul_precision(MatmulPrecision::fp32);
    r.used = "fp32";
    return r;
  }
  if (requested != "bf16") fail("precision: unknown value '", requested, "' (known: fp32, bf16)");
  if (!bf16_matmul_supported()) {
    set_matmul_precision(MatmulPrecision::fp32);
    r.used = "fp32";
    r.line = "precision bf16: this CPU has no AVX-512 BF16; training in fp32 instead";
    return r;
  }
  set_matmul_precision(MatmulPrecision::bf16);
  r.used = "bf16";
  r.bf16_gflops = matmul_rate(true);
  r.fp32_gflops = matmul_rate(false);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "precision bf16: matrix products in bf16 with fp32 accumulation (measured here: %.0f GFLOP/s bf16 vs "
                "%.0f fp32, x%.2f)%s",
                r.bf16_gflops, r.fp32_gflops, r.bf16_gflops / r.fp32_gflops,
                r.bf16_gflops < r.fp32_gflops ? "; bf16 is slower than fp32 on this CPU" : "");
  r.line = buf;
  return r;
}

}  // namespace jtok
