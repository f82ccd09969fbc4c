#include "train/fault_injection.h"

#include <csignal>
#include <cmath>
#include <cstdlib>

#include "cuda/training.h"

namespace jtok {

namespace {
int64_t step_from_env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoll(v) : -1;
}
}  // namespace

FaultInjection fault_injection_from_env() {
  FaultInjection f;
  f.nan_grad_at_step = step_from_env("JTOK_TEST_NAN_GRAD_AT_STEP");
  f.nan_table_row_at_step = step_from_env("JTOK_TEST_NAN_TABLE_ROW_AT_STEP");
  f.gather_checkpoints = std::getenv("JTOK_TEST_GATHER_CHECKPOINT") != nullptr;
  f.kill_after_checkpoint = step_from_env("JTOK_TEST_KILL_AFTER_CHECKPOINT");
  return f;
}

void inject_nan_table_row(FaultInjection& f, Model& model, int64_t step, int32_t x0, bool sharded) {
  if (step != f.nan_table_row_at_step || f.nan_table_row_done || sharded || model.tables.empty()) return;
  model.tables[0].mutable_row(x0)[0] = std::nanf("");
  f.nan_table_row_done = true;
}

void kill_after_checkpoint(const FaultInjection& f, int64_t step) {
  if (step == f.kill_after_checkpoint) std::raise(SIGKILL);
}

void inject_nan_grad(FaultInjection& f, Model& model, int64_t step) {
  if (step != f.nan_grad_at_step || f.nan_grad_done || model.grads.empty()) return;
  model.grads[model.grads.size() / 2] = std::nanf("");
  f.nan_grad_done = true;
}

void inject_nan_table_row(FaultInjection& f, cuda::DeviceTrainer& dev, int64_t step, int32_t x0, bool no_tables) {
  if (step != f.nan_table_row_at_step || f.nan_table_row_done || no_tables) return;
  dev.poison_table_row(0, x0);
  f.nan_table_row_done = true;
}

void inject_nan_grad(FaultInjection& f, cuda::DeviceTrainer& dev, int64_t step) {
  if (step != f.nan_grad_at_step || f.nan_grad_done) return;
  dev.poison_gradient();
  f.nan_grad_done = true;
}

}  // namespace jtok
