// bf16 copies of weight matrices for mixed-precision training (ops/linear.h at bf16 precision).
// A weight changes only at the optimizer step, yet every product used to round it to bf16 again:
// forward, and the backward's input gradient. Inside a Bf16WeightScope (the trainer opens one
// around a step's forwards and backwards) the first product that reads a weight keeps its bf16
// copy and the later ones reuse it, as llm.c and Megatron keep low-precision weight copies.
// The copy is the same rounding (quantize_bf16_rows) of the same values: the products' bits are
// those of the per-call conversion. The caller promises the weights do not change while a scope
// is open; outside one (evaluation, tests, inference) every call converts afresh.
#pragma once
#include <cstdint>
#include <vector>

namespace jtok {

// Opens a scope on this thread (nested scopes are one scope). Closing it drops the copies of
// matrices read in neither it nor the scope before (a model that was freed); the next scope
// converts every weight once more, after the optimizer has changed them.
class Bf16WeightScope {
 public:
  Bf16WeightScope();
  ~Bf16WeightScope();
  Bf16WeightScope(const Bf16WeightScope&) = delete;
  Bf16WeightScope& operator=(const Bf16WeightScope&) = delete;
};

bool bf16_weight_scope_open();  // on this thread

// W (rows, cols), row-major and compact, in bf16 (round to nearest even): inside an open scope the
// scope's copy (made on first use), else converted into scratch. Valid until the next call with
// the same scratch, or the scope's end.
const uint16_t* bf16_weight(const float* W, int64_t rows, int64_t cols, std::vector<uint16_t>& scratch);

// Matrices converted into this thread's scope so far (its copies), for tests.
int64_t bf16_weight_conversions();

}  // namespace jtok
