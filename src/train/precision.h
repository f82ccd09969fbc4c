// Mixed precision for training: `precision: "bf16"` (or --precision bf16) makes every matrix
// product of forward and backward take bf16 inputs with fp32 accumulation (ops/linear.h gemm_bf16);
// weights, gradients, table rows, the optimizer, norms, softmax, JTok / JTok-M gates, attention's
// blocked products and the loss stay fp32. Each weight is rounded to bf16 once per step (the
// trainer's ops/bf16_weights.h scope), and an input shared by several products (q/k/v, gate/up,
// a product's output gradient for its two backward products) once for all of them: the bits of
// rounding every operand per product. On a CPU without AVX-512 BF16 it falls back to fp32 and
// says so (never silently slow); where bf16 runs, the line also gives both precisions' measured
// matmul rate, since some AVX-512 BF16 hosts (no AMX) multiply bf16 no faster than fp32.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace jtok {

struct PrecisionReport {
  std::string requested, used;  // "fp32" | "bf16"
  double bf16_gflops = 0, fp32_gflops = 0;  // measured on one (1024 x 768 x 768) product; 0 if not run
  std::string line;                         // what to print
  nlohmann::json to_json() const;
};

// Sets the process's matmul precision for `requested` and reports what was done.
PrecisionReport apply_training_precision(const std::string& requested);

}  // namespace jtok
