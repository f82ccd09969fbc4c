// Fault injection: the trainer's test-only hooks, all of them, read from the environment once at
// the start of `train()`. Unset (as in every real run) they change nothing.
//   JTOK_TEST_NAN_GRAD_AT_STEP=S       a NaN in one backbone gradient of step S, after the sums over
//                                      ranks and before the optimizer (tests/test_nonfinite_step.sh).
//   JTOK_TEST_NAN_TABLE_ROW_AT_STEP=S  a NaN in the first token table's row of step S's first token,
//                                      before its first forward; replicated tables only (the same).
//   JTOK_TEST_GATHER_CHECKPOINT        with --embp, rank 0 gathers the whole tables and writes each
//                                      checkpoint alone: the reference the in-place sharded files are
//                                      compared with, byte for byte (tests/test_dist_train.sh).
// Each NaN is injected once: a step skipped under --skip-nonfinite-steps is retried clean.
// Steps are counted from 1, as in the log. Write faults (a full disk, a short write, a failing
// fsync or rename) are injected below the process, not here: tests/test_write_faults.sh
// (RLIMIT_FSIZE and the LD_PRELOAD shim tests/faults/write_fault_shim.cpp).
#pragma once
#include <cstdint>

#include "model/transformer.h"

namespace jtok {
namespace cuda {
class DeviceTrainer;
}

struct FaultInjection {
  int64_t nan_grad_at_step = -1;       // -1: never
  int64_t nan_table_row_at_step = -1;  // -1: never
  bool gather_checkpoints = false;
  int64_t kill_after_checkpoint = -1;  // -1: never; else SIGKILL right after that step's checkpoint
  bool nan_grad_done = false, nan_table_row_done = false;
};

FaultInjection fault_injection_from_env();

// At step `step` (from 1): row x0 of model.tables[0] gets a NaN, unless the tables are sharded
// (`sharded`) or absent.
void inject_nan_table_row(FaultInjection& f, Model& model, int64_t step, int32_t x0, bool sharded);
// At step `step` (from 1): the middle element of model.grads becomes a NaN.
void inject_nan_grad(FaultInjection& f, Model& model, int64_t step);
// JTOK_TEST_KILL_AFTER_CHECKPOINT=N: the process kills itself (SIGKILL, as `kill -9`) once the
// checkpoint of step N is complete: a resume test's kill at a known step.
void kill_after_checkpoint(const FaultInjection& f, int64_t step);
// The same on the GPU (--device cuda): the device's table 0 row x0, its flat gradients' middle.
void inject_nan_table_row(FaultInjection& f, cuda::DeviceTrainer& dev, int64_t step, int32_t x0, bool no_tables);
void inject_nan_grad(FaultInjection& f, cuda::DeviceTrainer& dev, int64_t step);

}  // namespace jtok
