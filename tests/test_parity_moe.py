"""jtok (float32) against the PyTorch reference (float64) on small MoE models (docs/model.md, "MoE").

Cases (parity.MOE_CASES), 3 layers of hidden 32 with 8 routed experts of inner size 24, each from
the same random weights and M = 2 micro-batches on both sides, compared like
tests/test_parity_dense.py (logits, LM losses, aux losses, lr, pre-clip grad norms, every step-0
gradient including router, shared and routed experts, final weights after 10 steps; same
thresholds, parity.TOL):
- moe_shared1: first layer dense, 1 shared expert, top-2, untied, no clipping;
- moe_shared2_normtopk_tied: 2 shared experts (one SwiGLU of 2 x 24), renormalised top-k weights,
  tied embeddings, wsd schedule, clipping enabled but inactive;
- moe_noshared_top3_clipped: every layer MoE (first_k_dense_replace 0), no shared expert, top-3,
  one kv head, clipping active at every step;
- moe_jtok: JTok tables on all 3 layers of moe_shared1's shape (the gate multiplies the MoE
  update as it does the MLP update).

On top of the table: the aux loss is positive on both sides; every expert that the step-0
routing chose has a nonzero gradient and every other expert exactly zero (in jtok's output), and
the step-0 routing has no near-tie that float32 could flip (else the case would test luck).

Fails (never skips) without a jtok binary that has the `parity` command.
"""
import sys

import numpy as np
import torch

import parity
from model import JTokConfig, MoE, Transformer

STEPS = 10


def moe_checks(case, cfg_dict, weights, batch, out, ref):
    cfg = JTokConfig.from_dict(cfg_dict)
    failures = []
    if cfg.moe_num_layers == 0:
        return [f"{case}: no MoE layer (the case tests nothing)"]
    if not (np.all(out["aux_loss"] > 0) and np.all(ref["aux_loss"] > 0)):
        failures.append(f"{case}: aux_loss not positive")
    # Step-0 routing in the reference (float64): which experts were used, and the smallest gap
    # between the k-th and (k+1)-th probability.
    model = Transformer(cfg).double()
    model.load_numpy({k: v.astype(np.float64) for k, v in weights.items()})
    used, gaps = {}, []

    def hook(layer_idx):
        def fn(mod, inputs, output):
            x = inputs[0].reshape(-1, cfg.hidden_size)
            p = torch.softmax(mod.gate(x), dim=-1)
            srt = torch.sort(p, dim=-1, descending=True, stable=True)
            gaps.append((srt.values[:, mod.k - 1] - srt.values[:, mod.k]).min().item())
            used.setdefault(layer_idx, set()).update(srt.indices[:, :mod.k].flatten().tolist())
        return fn

    for l, layer in enumerate(model.model.layers):
        if isinstance(layer.mlp, MoE):
            layer.mlp.register_forward_hook(hook(l))
    with torch.no_grad():
        for i in range(batch["input_ids"].shape[0]):
            model(torch.from_numpy(batch["input_ids"][i]).long())
    if min(gaps) < 1e-5:
        failures.append(f"{case}: step-0 routing has a near-tie ({min(gaps):.1e}); pick another seed")
    for l, experts in used.items():
        for e in range(cfg.n_routed_experts):
            g = out[f"grad.model.layers.{l}.mlp.experts.{e}.up_proj.weight"]
            if (e in experts) != bool(np.any(g)):
                failures.append(f"{case}: layer {l} expert {e}: used={e in experts} but gradient "
                                f"{'zero' if not np.any(g) else 'nonzero'}")
    print(f"  aux_loss step 0: jtok {out['aux_loss'][0]:.6f}, reference {ref['aux_loss'][0]:.6f}; "
          f"smallest top-k gap {min(gaps):.1e}; experts used per MoE layer "
          f"{[len(used[l]) for l in sorted(used)]} of {cfg.n_routed_experts}")
    return failures


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny tensors: threads only add OpenMP waits (slow on a busy machine)
    sys.exit(parity.run_parity_test(parity.MOE_CASES, STEPS, extra_checks=moe_checks))
