"""jtok (float32) against the PyTorch reference (float64) with JTok-M (docs/model.md "JTok-M", paper
section 3.3 and Appendix D).

Cases (parity.JTOKM_CASES), each from the same random weights and M = 2 micro-batches on both
sides, compared like tests/test_parity_dense.py (logits, LM loss, MoE aux loss where there are MoE
layers, JTok-M aux loss `jtokm_aux_loss`, lr, pre-clip grad norms, every step-0 gradient
including grad.model.layers.{l}.jtokm.router.weight (n_e, d), ...jtokm.scale (d) and every table
...jtokm.embed.{i}.weight (Vp, d, dense), and the final weights after the steps; same thresholds,
parity.TOL):
- jtokm_dense (a): dense, JTok-M on both layers, n_e = 5, K = 2, input ids from 30 distinct ids;
- jtokm_moe (b): MoE backbone (3 layers, the first dense), JTok-M on all layers, n_e = 4, K = 3,
  tied embeddings, wsd, clipping enabled but inactive;
- jtokm_nonorm_nodepth (c): dense, both ablations (jtokm_norm and jtokm_depth_scaling false) on
  layers 0 and 2 of 3, n_e = 4, K = 1 (the weight is 1, so the routers learn from the aux loss
  only), one kv head, clipping active;
- jtokm_with_jtok (d): dense, JTok on layers 0, 1 and JTok-M on layers 1, 2 (both on layer 1),
  n_e = 3, K = 2, jtokm_eps = 0.05, tied;
- jtokm_router_ties (e): layer 0's router is zero, so all its logits tie exactly and every
  position must take tables 0 and 1 (ties to the lower index); one step only.
The JTok-M cases run 10 steps (the ties case 1).

On top of the table, for each case:
- exactly the selected layers have jtokm tensors (router, scale, n_e tables), on both sides;
- the JTok-M aux loss is positive on both sides;
- the step-0 routing of the reference decides, exactly, which table rows get gradient: in jtok's
  grad.<table i of layer l>, the row of id x is nonzero iff some position with input id x chose
  table i at step 0 (any micro-batch); every other row (absent ids, ids routed elsewhere, padded
  rows) is exactly zero;
- the case is sound: over every step (reference, float64) no routing decision of JTok-M or MoE is
  a near-tie (gap between the K-th and (K+1)-th logit / probability < 1e-5) that float32 could
  flip, except the intended exact ties of the zero router at step 0; every table of every JTok-M
  layer is chosen at step 0 (outside the ties case); and the aux loss changes the routers'
  step-0 gradients well above the tolerance (so the aux gradient is tested);
- rows of ids absent from the batch were never routed to, so dense AdamW only decays them:
  final = init * prod_k (1 - lr_k wd) on both sides; padded rows stay zero.

What the engine must provide: `$JTOK_BIN parity --config C.json --weights W.safetensors --batch
B.safetensors --steps N --out O.safetensors` (interface at the top of tests/reference/parity.py)
reading the jtokm_* config fields and tensors model.layers.{l}.jtokm.{router.weight, scale,
embed.{i}.weight}, and writing, besides logits/loss/grad_norm/lr/grad.*/final.*, a float32 (N)
tensor `jtokm_aux_loss` (the JTok-M aux loss: mean over JTok-M layers, mean over micro-batches)
and `aux_loss` (MoE only, as before). The gradients are those of LM + MoE aux + JTok-M aux.

Fails (never skips) without a jtok binary that has the `parity` command. The reference half runs
alone with `--reference-only` (no engine needed): it checks that the cases are sound.
"""
import sys

import numpy as np
import torch

import parity
from model import JTokConfig, JTokM, MoE, Transformer
from train_ref import TrainConfig, accumulate_gradients, train_steps

STEPS = 10
MIN_GAP = 1e-5          # smallest allowed routing margin (logits for JTok-M, probabilities for MoE)
MIN_AUX_SHARE = 1e-2    # the aux loss must change the routers' gradients by at least this (relative)


def jtokm_names(cfg):
    """The tensor names under model.layers.{l}.jtokm. of a JTok-M layer."""
    return ["router.weight", "scale"] + [f"embed.{i}.weight" for i in range(cfg.jtokm_n_e)]


def reference_model(cfg_dict, weights):
    model = Transformer(JTokConfig.from_dict(cfg_dict)).double()
    model.load_numpy({k: v.astype(np.float64) for k, v in weights.items()})
    return model


def micro_batches_of(batch):
    return [(torch.from_numpy(batch["input_ids"][i]).long(), torch.from_numpy(batch["labels"][i]).long())
            for i in range(batch["input_ids"].shape[0])]


def reference_routing(case, cfg_dict, weights, batch, steps):
    """Reruns the reference (float64) and records its routing. Returns
    - routed: {layer: bool (n_e, Vp)}, routed[l][i, x]: some position of id x chose table i at step 0;
    - used: {layer: set of tables chosen at step 0};
    - gaps: list of (gap, step, kind, layer) for every forward: the smallest margin between the
      K-th and (K+1)-th routing score over the positions (JTok-M logits, MoE probabilities);
    - zero_ok: whether the zero-router layers had all logits exactly 0 at step 0."""
    cfg = JTokConfig.from_dict(cfg_dict)
    model = reference_model(cfg_dict, weights)
    state = {"step": 0}
    routed = {l: np.zeros((cfg.jtokm_n_e, cfg.padded_vocab_size), dtype=bool)
              for l in range(cfg.num_hidden_layers) if cfg.jtokm_on_layer(l)}
    used, gaps, zero_ok = {}, [], [True]
    zero_layers = parity.ZERO_ROUTERS.get(case, [])

    def jtokm_hook(l):
        def fn(mod, inputs, output):
            step, ids = state["step"], inputs[1]
            if step == 0:
                for k in range(mod.k):
                    routed[l][mod.top[..., k].flatten().numpy(), ids.flatten().numpy()] = True
                used.setdefault(l, set()).update(mod.top.flatten().tolist())
            if step == 0 and l in zero_layers:
                zero_ok[0] = zero_ok[0] and bool(torch.all(mod.logits == 0))
                return
            if mod.k < mod.n_e:
                srt = torch.sort(mod.logits, dim=-1, descending=True).values
                gaps.append(((srt[..., mod.k - 1] - srt[..., mod.k]).min().item(), step, "jtokm", l))
        return fn

    def moe_hook(l):
        def fn(mod, inputs, output):
            x = inputs[0].reshape(-1, cfg.hidden_size)
            p = torch.softmax(mod.gate(x), dim=-1)
            srt = torch.sort(p, dim=-1, descending=True).values
            if mod.k < mod.n_experts:
                gaps.append(((srt[:, mod.k - 1] - srt[:, mod.k]).min().item(), state["step"], "moe", l))
        return fn

    for l, layer in enumerate(model.model.layers):
        if layer.jtokm is not None:
            layer.jtokm.register_forward_hook(jtokm_hook(l))
        if isinstance(layer.mlp, MoE):
            layer.mlp.register_forward_hook(moe_hook(l))

    def next_step(step, m):
        state["step"] = step + 1

    train_steps(model, micro_batches_of(batch), TrainConfig.from_dict(cfg_dict), steps, on_gradients=next_step)
    return routed, used, gaps, zero_ok[0]


def aux_share(cfg_dict, weights, batch, ref):
    """{layer: ||g - g_noaux|| / ||g||} of each JTok-M router's step-0 gradient g (reference),
    g_noaux computed with the JTok-M aux coefficient set to 0."""
    model = reference_model(cfg_dict, weights)
    for layer in model.model.layers:
        if layer.jtokm is not None:
            layer.jtokm.coef = 0.0
    accumulate_gradients(model, micro_batches_of(batch))
    share = {}
    for l, layer in enumerate(model.model.layers):
        if layer.jtokm is not None:
            g = ref[f"grad.model.layers.{l}.jtokm.router.weight"]
            share[l] = parity.rel_err(layer.jtokm.router.weight.grad.numpy(), g)
    return share


def jtokm_checks(case, cfg_dict, weights, batch, out, ref, steps):
    cfg = JTokConfig.from_dict(cfg_dict)
    failures = []
    V, Vp, wd, n_e = cfg.vocab_size, cfg.padded_vocab_size, cfg_dict["weight_decay"], cfg.jtokm_n_e

    # Exactly the selected layers carry JTok-M tensors, on both sides.
    expect = {f"{kind}model.layers.{l}.jtokm.{t}" for l in range(cfg.num_hidden_layers) if cfg.jtokm_on_layer(l)
              for kind in ("grad.", "final.") for t in jtokm_names(cfg)}
    for side, d in (("jtok", out), ("reference", ref)):
        have = {k for k in d if ".jtokm." in k and k.startswith(("grad.", "final."))}
        if have != expect:
            failures.append(f"{case}: {side} jtokm tensors {sorted(have ^ expect)} differ from the selection")
    if not expect:
        return failures + [f"{case}: no layer has JTok-M (the case tests nothing)"]
    if not (np.all(out["jtokm_aux_loss"] > 0) and np.all(ref["jtokm_aux_loss"] > 0)):
        failures.append(f"{case}: jtokm_aux_loss not positive")

    # The case is sound: margins, table use, aux share (reference only).
    routing = reference_routing(case, cfg_dict, weights, batch, steps)
    failures += soundness(case, cfg_dict, weights, batch, ref, steps, routing)
    routed = routing[0]

    # Table gradient rows: nonzero exactly for the (table, id) pairs of the step-0 routing.
    present = np.zeros(Vp, dtype=bool)
    present[np.unique(batch["input_ids"])] = True
    absent = ~present
    absent[V:] = False
    decay = np.prod(1.0 - ref["lr"] * wd)
    for l in sorted(routed):
        for i in range(n_e):
            name = f"model.layers.{l}.jtokm.embed.{i}.weight"
            g = out["grad." + name]
            if g.shape != (Vp, cfg.hidden_size):
                failures.append(f"{case}: grad.{name} has shape {g.shape}, expected {(Vp, cfg.hidden_size)}")
                continue
            nonzero = np.any(g != 0, axis=1)
            wrong = np.flatnonzero(nonzero != routed[l][i])
            if wrong.size:
                failures.append(f"{case}: grad.{name}: rows {wrong[:8].tolist()}{'...' if wrong.size > 8 else ''} "
                                f"are {'nonzero' if nonzero[wrong[0]] else 'zero'} against the step-0 routing "
                                f"({routed[l][i].sum()} ids routed to this table)")
            # Rows of absent ids: never routed, so only the dense AdamW decay moves them.
            init, final, final_ref = weights[name], out["final." + name], ref["final." + name]
            expected = init[absent].astype(np.float64) * decay
            for side, f in (("jtok", final), ("reference", final_ref)):
                err = parity.rel_err(f[absent], expected)
                if err > 1e-6:
                    failures.append(f"{case}: final.{name} ({side}): absent rows off init * decay by {err:.2e}")
            if np.any(final[V:]):
                failures.append(f"{case}: final.{name} has nonzero padded rows")
        print(f"  layer {l}: ids routed per table at step 0 {[int(routed[l][i].sum()) for i in range(n_e)]} "
              f"of {int(present.sum())} present ids")
    print(f"  jtokm_aux_loss step 0: jtok {out['jtokm_aux_loss'][0]:.6e}, reference {ref['jtokm_aux_loss'][0]:.6e}")
    return failures


def soundness(case, cfg_dict, weights, batch, ref, steps, routing):
    """Failure messages when the case itself is not a fair test (reference only); `routing` is
    reference_routing's result."""
    cfg = JTokConfig.from_dict(cfg_dict)
    failures = []
    routed, used, gaps, zero_ok = routing
    zero_layers = parity.ZERO_ROUTERS.get(case, [])
    if gaps:
        worst = min(gaps)
        if worst[0] < MIN_GAP:
            failures.append(f"{case}: {worst[2]} routing of layer {worst[3]} at step {worst[1]} has a near-tie "
                            f"({worst[0]:.1e}); pick another seed")
        print(f"  smallest routing margin over {steps} steps: {worst[0]:.1e} ({worst[2]} layer {worst[3]}, "
              f"step {worst[1]})")
    for l in zero_layers:
        if not zero_ok:
            failures.append(f"{case}: layer {l}'s logits are not all zero at step 0")
        if used.get(l) != set(range(cfg.jtokm_top_k)):
            failures.append(f"{case}: layer {l} (zero router) chose tables {sorted(used.get(l, []))}, "
                            f"expected the lowest {cfg.jtokm_top_k}")
    for l, tables in used.items():
        if l not in zero_layers and tables != set(range(cfg.jtokm_n_e)):
            failures.append(f"{case}: layer {l} chose only tables {sorted(tables)} at step 0 (no diversity)")
    for l, share in aux_share(cfg_dict, weights, batch, ref).items():
        print(f"  layer {l}: router gradient changed by the aux loss {share:.1e} (relative)")
        if share < MIN_AUX_SHARE:
            failures.append(f"{case}: layer {l}: the aux loss changes the router gradient by only {share:.1e}")
    return failures


def reference_only():
    """The reference half: every case's reference run and soundness checks (no engine)."""
    failures = []
    for case, cfg_dict in parity.JTOKM_CASES.items():
        steps = parity.case_steps(case, STEPS)
        weights, batch = parity.case_inputs(case, cfg_dict)
        ref = parity.run_reference(cfg_dict, weights, batch, steps)
        print(f"\n{case}: reference (float64), {steps} steps, loss {ref['loss'][0]:.4f} -> {ref['loss'][-1]:.4f}, "
              f"jtokm_aux_loss {ref['jtokm_aux_loss'][0]:.3e}")
        failures += soundness(case, cfg_dict, weights, batch, ref, steps,
                              reference_routing(case, cfg_dict, weights, batch, steps))
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nOK (reference only)")
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny tensors: threads only add OpenMP waits (slow on a busy machine)
    if "--reference-only" in sys.argv[1:]:
        sys.exit(reference_only())

    def checks(case, cfg_dict, weights, batch, out, ref):
        return jtokm_checks(case, cfg_dict, weights, batch, out, ref, parity.case_steps(case, STEPS))

    sys.exit(parity.run_parity_test(parity.JTOKM_CASES, STEPS, extra_checks=checks))
