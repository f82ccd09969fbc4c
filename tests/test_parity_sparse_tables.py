"""jtok (float32) against the PyTorch reference (float64) with the lazy table optimizer,
`table_optimizer: "sparse"` (docs/jtok.md, "Table optimizer: dense or sparse").

The reference's lazy AdamW is train_ref.LazyTableAdamW: per step only the table rows with a
gradient move (AdamW with the global step's bias corrections); the other parameters get
torch.optim.AdamW as always. Cases (parity.SPARSE_TABLE_CASES), each with a different batch at
each of 10 steps (5 batches, step s uses batch s % 5), every batch from its own 30 random ids, so a
row is gathered at some steps and skipped at others:
- sparse_jtok: dense backbone, JTok tables on both layers;
- sparse_jtokm_moe: MoE backbone (first layer dense), JTok-M on all 3 layers (n_e = 4, K = 2) and
  JTok on layer 0;
- deferred_jtokm_moe: the same with the default dense table optimizer, which jtok runs deferred
  (rows without a gradient catch up when a gather reads them, train/optimizer.h) against torch's
  eager AdamW over whole tables;
- deferred_jtok: sparse_jtok's model and batches with the default dense (deferred) optimizer.
The deferred cases must have, in every table, rows that had a gradient, went without one for a
step or more and came back (parity.COMEBACK_CASES): their catch-up replays moments and weight
decay before the new update, and every final table is compared row by row
(parity.check_table_rows), so one skipped replay step on one row fails.
Compared like tests/test_parity_dense.py (logits, losses, grad norms, every step-0 gradient, the
final weights after 10 steps; parity.TOL). On top of the table, per case:
- the case is sound: with the other table optimizer the reference ends elsewhere, its final tables
  differ by at least 10x the final-weight tolerance, so a jtok that ignored `table_optimizer` would
  fail;
- lazy cases: rows of ids that no step's batch holds are exactly their initial values in jtok's
  final tables (lazy AdamW never touches them; dense AdamW would have decayed them); padded rows
  stay zero.

Before the cases, the reference's LazyTableAdamW is checked on its own: with a gradient on every
row at every step it equals torch.optim.AdamW (1e-12), and rows with a zero gradient keep their
weights exactly.

Fails (never skips) without a jtok binary that has the `parity` command.
"""
import sys

import numpy as np
import torch

import parity
from model import JTokConfig
from train_ref import LazyTableAdamW

STEPS = 10


def table_names(cfg):
    names = []
    for l in range(cfg.num_hidden_layers):
        if cfg.jtok_on_layer(l):
            names.append(f"model.layers.{l}.jtok.embed.weight")
        if cfg.jtokm_on_layer(l):
            names += [f"model.layers.{l}.jtokm.embed.{i}.weight" for i in range(cfg.jtokm_n_e)]
    return names


def sparse_checks(case, cfg_dict, weights, batch, out, ref):
    cfg = JTokConfig.from_dict(cfg_dict)
    failures = []
    names = table_names(cfg)
    if not names:
        return [f"{case}: no token-indexed tables"]
    lazy = cfg_dict["table_optimizer"] == "sparse"
    other_ref = parity.run_reference(dict(cfg_dict, table_optimizer="dense" if lazy else "sparse"), weights, batch, STEPS)
    gap = min(parity.rel_err(other_ref["final." + n], ref["final." + n]) for n in names)
    need = 10 * parity.TOL["final."]
    print(f"  dense vs lazy reference, smallest final-table difference: {gap:.2e} (need >= {need:.0e})")
    if gap < need:
        failures.append(f"{case}: lazy and dense table AdamW end too close ({gap:.2e}): the case cannot tell them apart")
    if not lazy:
        return failures
    seen = np.zeros(cfg.padded_vocab_size, dtype=bool)
    seen[np.unique(batch["input_ids"])] = True
    absent = ~seen
    absent[cfg.vocab_size:] = False
    print(f"  ids never in a batch: {int(absent.sum())} of {cfg.vocab_size}")
    for n in names:
        if not np.array_equal(out["final." + n][absent], weights[n][absent]):
            failures.append(f"{case}: {n}: rows of ids absent from every batch changed")
        if np.any(out["final." + n][cfg.vocab_size:] != 0):
            failures.append(f"{case}: {n}: padded rows are not zero")
    return failures


def lazy_adamw_checks():
    """LazyTableAdamW against torch.optim.AdamW: equal when every row has a gradient every step;
    rows with a zero gradient untouched."""
    failures = []
    gen = torch.Generator().manual_seed(5)
    init = torch.randn(12, 6, generator=gen, dtype=torch.float64)
    a = torch.nn.Parameter(init.clone())
    b = torch.nn.Parameter(init.clone())
    hyper = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    dense = torch.optim.AdamW([a], lr=1e-2, **hyper)
    lazy = LazyTableAdamW([b], 1e-2, **hyper)
    for step in range(5):
        g = torch.randn(12, 6, generator=gen, dtype=torch.float64)
        a.grad, b.grad = g.clone(), g.clone()
        for opt in (dense, lazy):
            opt.param_groups[0]["lr"] = 1e-2 * (step + 1)
            opt.step()
    err = (a - b).abs().max().item()
    print(f"LazyTableAdamW vs torch AdamW, every row with a gradient: max abs diff {err:.1e}")
    if err > 1e-12:
        failures.append(f"LazyTableAdamW differs from torch AdamW with full gradients ({err:.2e})")
    before = b.detach().clone()
    g = torch.randn(12, 6, generator=gen, dtype=torch.float64)
    g[3:7] = 0
    b.grad = g
    lazy.step()
    if not torch.equal(b[3:7], before[3:7]):
        failures.append("LazyTableAdamW moved rows with a zero gradient")
    if torch.equal(b[:3], before[:3]):
        failures.append("LazyTableAdamW left rows with a gradient unchanged")
    return failures


if __name__ == "__main__":
    own = lazy_adamw_checks()
    if own:
        print("FAILED:\n  " + "\n  ".join(own))
        sys.exit(1)
    sys.exit(parity.run_parity_test(parity.SPARSE_TABLE_CASES, STEPS, extra_checks=sparse_checks))
