"""jtok (float32) against the PyTorch reference (float64) with JTok tables (docs/model.md, "JTok").

Cases (parity.JTOK_CASES), each from the same random weights and M = 2 micro-batches on both
sides, compared like tests/test_parity_dense.py (logits, losses, lr, pre-clip grad norms, every
step-0 gradient including grad.model.layers.{i}.jtok.embed.weight (dense, (Vp, d)) and
grad...jtok.scale, final weights after 10 steps; same thresholds, parity.TOL):
- jtok_all_gqa: tables on both layers, GQA, untied, input ids drawn from 20 distinct ids
  (~5 repeats each over the 96 positions, so the engine's deduplicated gathers and summed row
  gradients matter);
- jtok_subset_nonorm_tied: tables on layers 0 and 2 of 3, without the L2 norm (the paper's
  ablation), tied embeddings, 30 distinct ids;
- jtok_clipped: tables on both layers, one kv head, clipping active at every step, a jtok_eps
  (0.05) large enough that its place in the formula matters, ids from the whole vocabulary.

On top of the table, per JTok table:
- exactly the selected layers have jtok tensors in jtok's output;
- gradient rows of ids absent from the batch (and padded rows) are exactly zero, present rows
  are not;
- the final rows of absent ids still changed: dense AdamW decays them every step, to exactly
  init * prod_k (1 - lr_k * weight_decay) (their moments stay zero), on both sides; padded rows
  stay zero.

Fails (never skips) without a jtok binary that has the `parity` command.
"""
import re
import sys

import numpy as np
import torch

import parity
from model import JTokConfig

STEPS = 10


def jtok_checks(case, cfg_dict, weights, batch, out, ref):
    cfg = JTokConfig.from_dict(cfg_dict)
    failures = []
    V, Vp, wd = cfg.vocab_size, cfg.padded_vocab_size, cfg_dict["weight_decay"]

    # Exactly the selected layers carry JTok tensors, on both sides.
    expect = {f"{kind}model.layers.{l}.jtok.{t}" for l in range(cfg.num_hidden_layers)
              if cfg.jtok_on_layer(l) for kind in ("grad.", "final.") for t in ("embed.weight", "scale")}
    for side, d in (("jtok", out), ("reference", ref)):
        have = {k for k in d if ".jtok." in k and k.startswith(("grad.", "final."))}
        if have != expect:
            failures.append(f"{case}: {side} jtok tensors {sorted(have ^ expect)} differ from the selection")
    if not expect:
        failures.append(f"{case}: no layer has JTok (the case tests nothing)")

    ids = batch["input_ids"]
    present = np.zeros(Vp, dtype=bool)
    present[np.unique(ids)] = True
    absent = ~present
    absent[V:] = False          # real ids missing from the batch
    if parity.DISTINCT_IDS.get(case) is not None and np.unique(ids).size > parity.DISTINCT_IDS[case]:
        failures.append(f"{case}: the batch has more distinct ids than meant")
    if not absent.any():
        failures.append(f"{case}: every id occurs in the batch (nothing to check for absent rows)")
    # lr_k of the 10 steps: the weight decay factor of a row that never gets a gradient.
    decay = np.prod(1.0 - ref["lr"] * wd)

    for l in range(cfg.num_hidden_layers):
        if not cfg.jtok_on_layer(l):
            continue
        name = f"model.layers.{l}.jtok.embed.weight"
        g = out["grad." + name]
        if g.shape != (Vp, cfg.hidden_size):
            failures.append(f"{case}: grad.{name} has shape {g.shape}, expected {(Vp, cfg.hidden_size)}")
            continue
        if np.any(g[absent]) or np.any(g[V:]):
            failures.append(f"{case}: grad.{name} has nonzero rows for ids absent from the batch")
        if not np.all(np.any(g[present] != 0, axis=1)):
            failures.append(f"{case}: grad.{name} has an all-zero row for an id in the batch")

        init, final, final_ref = weights[name], out["final." + name], ref["final." + name]
        if not np.all(np.any(final[absent] != init[absent], axis=1)):
            failures.append(f"{case}: final.{name}: rows of absent ids did not change (no dense decay?)")
        expected = init[absent].astype(np.float64) * decay
        for side, f in (("jtok", final), ("reference", final_ref)):
            err = parity.rel_err(f[absent], expected)
            if err > 1e-6:
                failures.append(f"{case}: final.{name} ({side}): absent rows off init * decay by {err:.2e}")
        err = parity.rel_err(final[absent], final_ref[absent])
        if err > parity.tolerance("final."):
            failures.append(f"{case}: final.{name}: absent rows differ from the reference by {err:.2e}")
        if np.any(final[V:]):
            failures.append(f"{case}: final.{name} has nonzero padded rows")
        print(f"  {name}: {present[:V].sum()} ids present, {absent.sum()} absent; absent rows "
              f"vs init*decay {parity.rel_err(final[absent], expected):.1e}, vs reference {err:.1e}")
    return failures


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny tensors: threads only add OpenMP waits (slow on a busy machine)
    sys.exit(parity.run_parity_test(parity.JTOK_CASES, STEPS, extra_checks=jtok_checks))
