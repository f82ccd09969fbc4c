"""jtok (float32) against the PyTorch reference (float64) on small dense models.

For each case of parity.CASES (GQA untied, no clipping; MHA tied with head_dim != hidden/heads,
the wsd schedule, clipping enabled but inactive; GQA with one kv head, active clipping and the
constant schedule), both sides start from the same random weights and the same M micro-batches,
and we compare the logits of micro-batch 0, every parameter gradient of step 0, and 10
optimizer steps (losses, pre-clip grad norms, learning rates, final weights). A table of the
relative errors is printed for the docs.

Thresholds (relative error ||jtok - ref|| / ||ref|| per tensor; parity.TOL, each a stated
multiple, 3x to 10x, of the worst error the engine reaches over every parity case):
- logits 5e-6, losses 5e-7, grad norms 5e-6, step-0 gradients 1e-5. A float32 implementation of
  the same maths lands near 1e-7..1e-6 (the reference itself in float32 too, see
  `python3 tests/reference/parity.py --self`); a real mistake shows up at 1e-2 or more.
- lr: 1e-7 (float32 rounding of the same formula, at most 6e-8).
- final weights after 10 steps: 1e-4. Adam normalises each update by sqrt(v), so an element whose
  gradient is at the float32 noise level can move by a different O(lr) amount on each side, and
  the weight differences feed back into later gradients: differences grow step by step (to
  3.3e-5 in the worst case, jtokm_router_ties, against ~1e-6 for step-0 gradients).
- final token-indexed tables, row by row (parity.check_table_rows; a whole-tensor error would
  dilute one wrong row by the table's size): 2e-6 for rows that never had a gradient (the weight
  decay alone moved them; a skipped step is lr * wd >= 3e-5 off), 5e-4 for rows that had one.

Without a jtok binary that has the `parity` command the test fails (`parity.py --self` runs the
float32 reference in jtok's place, to check the harness alone). The thresholds (parity.TOL), the
table and the checks shared with tests/test_parity_jtok.py live in parity.py.
"""
import sys

import torch

import parity

STEPS = 10

if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny tensors: threads only add OpenMP waits (slow on a busy machine)
    sys.exit(parity.run_parity_test(parity.CASES, STEPS))
