"""jtok (float32) against the PyTorch reference (float64) on small dense models.

For each case of parity.CASES (GQA untied, no clipping; MHA tied with head_dim != hidden/heads,
the wsd schedule, clipping enabled but inactive; GQA with one kv head, active clipping and the
constant schedule), both sides start from the same random weights and the same M micro-batches,
and we compare the logits of micro-batch 0, every parameter gradient of step 0, and 10
optimizer steps (losses, pre-clip grad norms, learning rates, final weights). A table of the
relative errors is printed for the docs.

Thresholds (relative error ||jtok - ref|| / ||ref|| per tensor):
- logits, losses, grad norms, step-0 gradients: 1e-4. A float32 implementation of the same
  maths lands near 1e-6 (the reference itself in float32 reaches 1e-7..1e-6, see
  `python3 tests/reference/parity.py --self`), so 1e-4 leaves room for different summation
  orders and fast kernels while catching any real mistake (which shows up at 1e-2 or more).
- lr: 1e-6 (float32 rounding of the same formula).
- final weights after 10 steps: 1e-3. Adam normalises each update by sqrt(v), so an element whose
  gradient is at the float32 noise level can move by a different O(lr) amount on each side, and
  the weight differences feed back into later gradients: differences grow step by step
  (the float32 reference reaches up to ~2e-5 here, against 1e-6 for step-0 gradients).

Without a jtok binary that has the `parity` command the test fails (`parity.py --self` runs the
float32 reference in jtok's place, to check the harness alone).
"""
import os
import sys
import tempfile

import numpy as np
import torch

import parity
from model import JTokConfig

STEPS = 10
TOL = {"logits": 1e-4, "loss": 1e-4, "grad_norm": 1e-4, "lr": 1e-6, "grad.": 1e-4, "final.": 1e-3}


def tolerance(name):
    for prefix, tol in TOL.items():
        if name == prefix or (prefix.endswith(".") and name.startswith(prefix)):
            return tol
    raise KeyError(name)


def check_case(case, cfg_dict, run_other, label):
    """Returns a list of failure messages (empty when the case passes)."""
    cfg = JTokConfig.from_dict(cfg_dict)
    weights = parity.random_weights(cfg, cfg_dict["seed"])
    batch = parity.random_batch(cfg_dict, cfg_dict["seed"])
    ref = parity.run_reference(cfg_dict, weights, batch, STEPS)
    out = run_other(cfg_dict, weights, batch)

    failures = []
    rows = parity.compare(out, ref)
    width = max(len(n) for n, _ in rows)
    print(f"\n{case}: {label} vs reference (float64), {STEPS} steps")
    print(f"  {'tensor'.ljust(width)}  rel err   limit")
    for name, err in rows:
        tol = tolerance(name)
        ok = err <= tol
        print(f"  {name.ljust(width)}  {err:.2e}  {tol:.0e}{'' if ok else '  FAIL'}")
        if not ok:
            failures.append(f"{case}: {name} rel err {err:.3e} > {tol:.0e}")
    for kind in ("grad.", "final."):
        worst = max((e, n) for n, e in rows if n.startswith(kind))
        print(f"  worst {kind[:-1]}: {worst[0]:.2e} ({worst[1]})")

    # The padded lm_head rows (columns >= vocab_size of the logits) get exactly zero gradient,
    # and with zero gradient and zero start AdamW leaves them exactly zero.
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    V = cfg.vocab_size
    if np.any(out["grad." + head][V:] != 0):
        failures.append(f"{case}: grad.{head} has nonzero padded rows")
    if np.any(out["final." + head][V:] != 0):
        failures.append(f"{case}: final.{head} has nonzero padded rows")
    # The cases mean clipping to be active at every step (max_grad_norm < 1) or enabled but
    # never active (max_grad_norm >= 1); check that they do what they mean.
    max_norm = cfg_dict["max_grad_norm"]
    if 0 < max_norm < 1 and not np.all(ref["grad_norm"] > max_norm):
        failures.append(f"{case}: clipping was meant to be active at every step")
    if max_norm >= 1 and not np.all(ref["grad_norm"] < max_norm):
        failures.append(f"{case}: clipping was meant to be inactive at every step")
    return failures


def main():
    jtok_bin = os.environ.get("JTOK_BIN")
    if not parity.jtok_has_parity(jtok_bin):
        print(f"FAILED: {jtok_bin or '$JTOK_BIN'} has no `parity` command")
        return 1
    label = "jtok (float32)"

    def run_other(cfg_dict, weights, batch):
        with tempfile.TemporaryDirectory() as tmp:
            return parity.run_jtok(jtok_bin, cfg_dict, weights, batch, STEPS, tmp)

    failures = []
    for case, cfg_dict in parity.CASES.items():
        failures += check_case(case, cfg_dict, run_other, label)
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nOK")
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny tensors: threads only add OpenMP waits (slow on a busy machine)
    sys.exit(main())
