"""Parity between jtok and the PyTorch reference: same weights, same batches, compare everything.

The jtok side is the command

    $JTOK_BIN parity --config CFG.json --weights W.safetensors --batch B.safetensors \
                     --steps N --out O.safetensors

CFG.json      one flat JSON object with model and training fields (docs/model.md names)
W.safetensors initial weights, float32, safetensors names of docs/model.md
B.safetensors input_ids, labels: int32 (M, B, T), M = gradient_accumulation_steps; the same
              M micro-batches are used at every one of the N steps; or (S, M, B, T): step s
              uses the M micro-batches [s % S] (cases of STEP_BATCHES)
O.safetensors logits float32 (B, T, vocab_size): micro-batch 0 at the initial weights, real
              vocabulary columns only; loss (LM), aux_loss (MoE load balance, mean over the
              micro-batches), jtokm_aux_loss (JTok-M load balance, mean over the JTok-M layers
              and the micro-batches; compared when the config has JTok-M layers), grad_norm, lr
              float32 (N); grad.<name>: every parameter's gradient at step 0 before clipping
              (the gradient of LM + MoE aux + JTok-M aux); final.<name>: every parameter
              after N steps.

`run_reference` produces the same dict with the PyTorch model (float64 by default), and
`compare` gives one relative error ||a - b|| / ||b|| per tensor.

On its own:  python3 parity.py [--jtok BIN] [--case NAME] [--steps N]
(without --jtok it compares the reference in float32 against float64: a calibration showing
what an exact float32 implementation reaches.)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

import safetensors_np
from model import JTokConfig, Transformer
from train_ref import TrainConfig, is_table, train_steps

# Test cases: small models that exercise GQA, padded vocabulary, tied embeddings, an explicit
# head_dim different from hidden/heads, the three lr schedules, and clipping off, on but inactive
# (max_grad_norm above every norm), and active.
BASE = {
    "model_type": "jtok_dense",
    "vocab_size": 300, "vocab_pad_multiple": 64,          # padded to 320
    "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2,   # GQA, group 2
    "head_dim": 0, "intermediate_size": 160,
    "max_position_embeddings": 32, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "initializer_range": 0.1,
    "seq_len": 16, "micro_batch_size": 3, "gradient_accumulation_steps": 2,
    "max_steps": 10, "learning_rate": 3e-3, "min_lr": 3e-4, "lr_scheduler_type": "cosine",
    "warmup_ratio": 0.0, "warmup_steps": 2, "decay_ratio": 0.2,
    "weight_decay": 0.1, "adam_beta1": 0.9, "adam_beta2": 0.95, "adam_epsilon": 1e-8,
    "max_grad_norm": 0.0, "seed": 1234,
}
CASES = {
    "gqa_untied": dict(BASE),
    "mha_tied_headdim": dict(BASE, tie_word_embeddings=True, num_key_value_heads=4, head_dim=32,
                             lr_scheduler_type="wsd", decay_ratio=0.3, max_grad_norm=10.0, seed=7),
    "gqa_clipped": dict(BASE, num_key_value_heads=1, max_grad_norm=0.05, lr_scheduler_type="constant",
                        warmup_steps=-1, warmup_ratio=0.25, seed=99),
    # The backbone variants of imported models (docs/model.md "Variants"): Qwen3's per-head q/k
    # RMSNorm with a head_dim apart from hidden/heads; Qwen2's q/k/v biases with Llama 3's rope
    # scaling, its original context set to 16 so that the scaled and blended bands both fall
    # inside the 16 positions of a sequence.
    "qwen3_qknorm_headdim": dict(BASE, qk_norm=True, head_dim=24, tie_word_embeddings=True, seed=13),
    "qwen2_bias_llama3_rope": dict(BASE, attention_bias=True, rope_scaling_type="llama3", rope_scaling_factor=8.0,
                                   rope_scaling_low_freq_factor=1.0, rope_scaling_high_freq_factor=4.0,
                                   rope_scaling_original_max_position_embeddings=16, seed=17),
}
# JTok cases (docs/model.md, "JTok"): tables on all layers of the GQA untied model, the batch
# drawn from 20 distinct ids so that each id repeats ~5 times (the engine deduplicates its
# gathers and sums repeated rows' gradients); a subset of 3 layers without the norm (the
# paper's ablation) and tied embeddings; active clipping with a jtok_eps large enough to matter.
JTOK_CASES = {
    "jtok_all_gqa": dict(BASE, jtok=True, jtok_layers="all", jtok_init_std=0.1, seed=11),
    "jtok_subset_nonorm_tied": dict(BASE, num_hidden_layers=3, jtok=True, jtok_layers="0,2",
                                    jtok_norm=False, jtok_init_std=0.1, tie_word_embeddings=True,
                                    lr_scheduler_type="wsd", decay_ratio=0.3, seed=23),
    "jtok_clipped": dict(BASE, num_key_value_heads=1, jtok=True, jtok_layers="all", jtok_eps=0.05,
                         jtok_init_std=0.1, max_grad_norm=0.05, lr_scheduler_type="constant",
                         seed=5),
}
# Cases whose input ids come from only this many distinct token ids (the others use the whole
# vocabulary). Kept out of the config dicts, which go to jtok as they are.
DISTINCT_IDS = {"jtok_all_gqa": 20, "jtok_subset_nonorm_tied": 30}
# MoE cases (docs/model.md, "MoE"): 3 layers of hidden 32, the first dense, 8 routed experts of
# inner size 24, top-2; a large aux coefficient so that the aux gradient is well above noise.
MOE_BASE = dict(BASE, model_type="jtok_moe", hidden_size=32, num_hidden_layers=3, intermediate_size=64,
                first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                moe_intermediate_size=24, router_aux_loss_coef=0.01, norm_topk_prob=False, initializer_range=0.2)
MOE_CASES = {
    "moe_shared1": dict(MOE_BASE, seed=31),
    "moe_shared2_normtopk_tied": dict(MOE_BASE, n_shared_experts=2, norm_topk_prob=True, tie_word_embeddings=True,
                                      lr_scheduler_type="wsd", decay_ratio=0.3, max_grad_norm=10.0, seed=37),
    "moe_noshared_top3_clipped": dict(MOE_BASE, n_shared_experts=0, num_experts_per_tok=3, first_k_dense_replace=0,
                                      num_key_value_heads=1, max_grad_norm=0.05, lr_scheduler_type="constant",
                                      seed=41),
    # Qwen3-MoE's layout: no shared experts, normalised top-k, q/k norm, layer 1 kept dense by
    # mlp_only_layers (MoE on layers 0 and 2).
    "qwen3moe_mlp_only": dict(MOE_BASE, n_shared_experts=0, norm_topk_prob=True, first_k_dense_replace=0,
                              mlp_only_layers="1", qk_norm=True, seed=47),
    # JTok on an MoE backbone (the paper's JTok-on-MoE runs): the gate multiplies the MoE update.
    "moe_jtok": dict(MOE_BASE, jtok=True, jtok_layers="all", jtok_init_std=0.1, seed=43),
}
# JTok-M cases (docs/model.md "JTok-M"; tests/test_parity_jtokm.py): a large aux coefficient so that
# the aux gradient is well above noise in the routers' gradients; tables with std 0.1 so that the
# injection matters next to the hidden states (init_std 0.1 like the embeddings).
JTOKM = dict(jtokm=True, jtokm_layers="all", jtokm_aux_loss_coef=0.05, jtokm_init_std=0.1)
JTOKM_CASES = {
    # (a) dense, JTok-M on both layers, the paper's n_e = 5, K = 2, repeated ids.
    "jtokm_dense": dict(BASE, **JTOKM, jtokm_n_e=5, jtokm_top_k=2, seed=51),
    # (b) MoE backbone (first layer dense), JTok-M on all 3 layers, n_e = 4, K = 3, tied, wsd,
    #     clipping enabled but inactive; aux coefficient 0.1 (with 0.05 the aux changed layer 0's
    #     router gradient by under 1%); a seed whose routing margins stay >= 1e-4 for 10 steps.
    "jtokm_moe": dict(MOE_BASE, **dict(JTOKM, jtokm_aux_loss_coef=0.1), jtokm_n_e=4, jtokm_top_k=3,
                      tie_word_embeddings=True, lr_scheduler_type="wsd", decay_ratio=0.3, max_grad_norm=10.0,
                      seed=67),
    # (c) dense, the two ablations: no norm and no depth scaling, on layers 0 and 2 of 3; K = 1
    #     (w = 1: the routers learn from the aux loss only); one kv head, clipping active.
    "jtokm_nonorm_nodepth": dict(BASE, **dict(JTOKM, jtokm_layers="0,2"), num_hidden_layers=3,
                                 jtokm_norm=False, jtokm_depth_scaling=False, jtokm_n_e=4, jtokm_top_k=1,
                                 num_key_value_heads=1, max_grad_norm=0.05, lr_scheduler_type="constant",
                                 seed=57),
    # (d) dense, JTok on layers 0, 1 and JTok-M on layers 1, 2 of 3 (layer 1 has both), n_e = 3,
    #     K = 2, a jtokm_eps (0.05) large enough that its place in the formula matters, tied.
    "jtokm_with_jtok": dict(BASE, **dict(JTOKM, jtokm_layers="1,2"), num_hidden_layers=3,
                            jtok=True, jtok_layers="0,1", jtok_init_std=0.1, jtokm_n_e=3, jtokm_top_k=2,
                            jtokm_eps=0.05, tie_word_embeddings=True, seed=59),
    # (e) exact ties: layer 0's router is zero (ZERO_ROUTERS), so every logit is exactly 0 on both
    #     sides and every position takes tables 0 and 1; one optimizer step only (MAX_STEPS: after
    #     it the router is no longer zero and near-ties could go either way in float32).
    "jtokm_router_ties": dict(BASE, **JTOKM, jtokm_n_e=4, jtokm_top_k=2, seed=61),
}
DISTINCT_IDS.update({"jtokm_dense": 30, "jtokm_with_jtok": 30})
# Lazy table AdamW (table_optimizer "sparse", docs/jtok.md; tests/test_parity_sparse_tables.py):
# a different batch at each step, each from its own 30 ids, so that every table row is gathered at
# some steps and skipped at others (with one batch for all steps lazy and dense differ only on
# rows never gathered).
SPARSE_TABLE_CASES = {
    "sparse_jtok": dict(BASE, jtok=True, jtok_layers="all", jtok_init_std=0.1, table_optimizer="sparse",
                        seed=71),
    "sparse_jtokm_moe": dict(MOE_BASE, **JTOKM, jtokm_n_e=4, jtokm_top_k=2, jtok=True, jtok_layers="0",
                             jtok_init_std=0.1, table_optimizer="sparse", seed=73),
}
# The same JTok-M + JTok on MoE case with the default dense table optimizer: jtok defers the
# updates of rows without a gradient and replays them when a gather reads the row (or before the
# final dump), which must equal torch's eager AdamW over whole tables.
SPARSE_TABLE_CASES["deferred_jtokm_moe"] = dict(SPARSE_TABLE_CASES["sparse_jtokm_moe"], table_optimizer="dense")
# And JTok alone on a dense backbone, deferred: a row's replay is then seen by JTok's own gather
# (the next step's forward reads the caught-up row) as well as by the final sync.
SPARSE_TABLE_CASES["deferred_jtok"] = dict(SPARSE_TABLE_CASES["sparse_jtok"], table_optimizer="dense")
DISTINCT_IDS.update({"sparse_jtok": 30, "sparse_jtokm_moe": 30, "deferred_jtokm_moe": 30, "deferred_jtok": 30})
# Cases with one batch per step: this many batches, step s uses batch s % S.
STEP_BATCHES = {"sparse_jtok": 5, "sparse_jtokm_moe": 5, "deferred_jtokm_moe": 5, "deferred_jtok": 5}
# Cases that must have, in every table, rows with a gradient at some step, none at one or more
# later steps, and one again after (check_table_rows): the rows whose missed steps the deferred
# table optimizer replays before their next update.
COMEBACK_CASES = {"deferred_jtokm_moe", "deferred_jtok"}
# JTok-M layers whose router starts at exactly zero (all logits tie), per case.
ZERO_ROUTERS = {"jtokm_router_ties": [0]}
# Cases run for at most this many optimizer steps.
MAX_STEPS = {"jtokm_router_ties": 1}
ALL_CASES = dict(CASES, **JTOK_CASES, **MOE_CASES, **JTOKM_CASES, **SPARSE_TABLE_CASES)

# Parity thresholds: relative error ||jtok - ref|| / ||ref|| per tensor, and per row for the
# final token-indexed tables (check_table_rows). Each is a stated multiple of the worst error the
# engine reaches over all ALL_CASES (float32 against the float64 reference; measured 2026-11-23 on
# the 2-core CI machine, OMP_NUM_THREADS=2; per case in docs/parity.md): room for another host's
# summation order, and no room for a real mistake. One table row that skips a single catch-up step
# (decay only: a relative change lr * wd >= 3e-5 at min_lr here; with moments: ~lr, 1e-3..1e-2)
# is far outside "table_row_never" / "table_row"; the reasons for the final-weight limits are in
# tests/test_parity_dense.py.
TOL = {
    "logits": 5e-6,          # reached 6.3e-7 (moe_jtok): 8x
    "loss": 5e-7,            # reached 6.4e-8 (gqa_clipped): 8x
    "aux_loss": 5e-7,        # reached 6.0e-8 (sparse_jtokm_moe): 8x
    "jtokm_aux_loss": 3e-7,  # reached 3.1e-8 (jtokm_router_ties): 10x
    "grad_norm": 5e-6,       # reached 7.6e-7 (moe_noshared_top3_clipped): 6.5x
    "lr": 1e-7,              # reached 2.1e-8 (float32 rounding of the float64 lr, at most 6e-8): 5x
    "grad.": 1e-5,           # reached 2.0e-6 (moe_shared1): 5x
    "final.": 1e-4,          # reached 3.3e-5 (jtokm_router_ties), 1.4e-5 (moe_jtok), else <= 5.5e-6: 3x / 7x
    # Worst row of a final table, rows that never had a gradient (only the weight decay moved
    # them, replayed by the deferred optimizer): reached 2.2e-7 (jtokm_nonorm_nodepth): 9x.
    "table_row_never": 2e-6,
    # Worst row of a final table, rows with a gradient at some step: reached 8.7e-5
    # (deferred_jtok; Adam's 1/sqrt(v) amplifies float32 noise on elements of small gradient): 6x.
    "table_row": 5e-4,
}


def random_weights(cfg, seed):
    """Random float32 weights for a JTokConfig: N(0, initializer_range) matrices (o_proj and
    down_proj scaled by 1/sqrt(2 layers)), norm gains 1 + N(0, 0.1) so that their gradients are
    exercised, padded embedding / lm_head rows zero. JTok tables N(0, jtok_init_std) with padded
    rows zero; JTok scales 1 + N(0, 0.3) so that the gate varies by dimension. JTok-M tables
    N(0, jtokm_init_std) with padded rows zero, scales 1 + N(0, 0.3), routers N(0, initializer_range)."""
    rng = np.random.default_rng(seed)
    model = Transformer(cfg)  # only for names and shapes
    std = cfg.initializer_range
    out = {}
    for name, p in model.state_dict().items():
        shape = tuple(p.shape)
        if name.endswith("jtok.scale"):
            w = 1.0 + 0.3 * rng.standard_normal(shape)
        elif name.endswith("jtok.embed.weight"):
            w = cfg.jtok_init_std * rng.standard_normal(shape)
            w[cfg.vocab_size:] = 0.0
        elif name.endswith("jtokm.scale"):
            w = 1.0 + 0.3 * rng.standard_normal(shape)
        elif ".jtokm.embed." in name:
            w = cfg.jtokm_init_std * rng.standard_normal(shape)
            w[cfg.vocab_size:] = 0.0
        elif len(shape) == 1:
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif "o_proj" in name or "down_proj" in name:
            w = std / np.sqrt(2 * cfg.num_hidden_layers) * rng.standard_normal(shape)
        else:
            w = std * rng.standard_normal(shape)
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            w[cfg.vocab_size:] = 0.0
        out[name] = w.astype(np.float32)
    return out


def random_batch(cfg_dict, seed, distinct_ids=None, step_batches=None):
    """input_ids, labels: int32 (M, B, T), tokens < vocab_size. With distinct_ids, the input ids
    are drawn from that many distinct ids only (so ids repeat within and across micro-batches).
    With step_batches = S: (S, M, B, T), one batch per step, each step's ids drawn from its own
    random set of distinct_ids ids (so a table row is gathered at some steps and not others)."""
    rng = np.random.default_rng(seed + 1)
    shape = (cfg_dict["gradient_accumulation_steps"], cfg_dict["micro_batch_size"], cfg_dict["seq_len"])
    V = cfg_dict["vocab_size"]
    if step_batches is not None:
        input_ids = np.stack([rng.choice(rng.choice(V, size=distinct_ids, replace=False), size=shape)
                              for _ in range(step_batches)]).astype(np.int32)
        labels = rng.integers(0, V, size=input_ids.shape, dtype=np.int32)
        return {"input_ids": input_ids, "labels": labels}
    if distinct_ids is None:
        input_ids = rng.integers(0, V, size=shape, dtype=np.int32)
    else:
        ids = rng.choice(V, size=distinct_ids, replace=False)
        input_ids = rng.choice(ids, size=shape).astype(np.int32)
    labels = rng.integers(0, V, size=shape, dtype=np.int32)
    return {"input_ids": input_ids, "labels": labels}


def step_micro_batches(batch, step):
    """The (input_ids, labels) micro-batches that optimizer step `step` uses."""
    x, y = batch["input_ids"], batch["labels"]
    if x.ndim == 4:
        x, y = x[step % x.shape[0]], y[step % y.shape[0]]
    return [(torch.from_numpy(x[i]).long(), torch.from_numpy(y[i]).long()) for i in range(x.shape[0])]


def case_inputs(case, cfg_dict):
    """(weights, batch) of a case, seeded by its config's seed (ZERO_ROUTERS: JTok-M routers zeroed)."""
    weights = random_weights(JTokConfig.from_dict(cfg_dict), cfg_dict["seed"])
    for l in ZERO_ROUTERS.get(case, []):
        weights[f"model.layers.{l}.jtokm.router.weight"][:] = 0.0
    batch = random_batch(cfg_dict, cfg_dict["seed"], DISTINCT_IDS.get(case), STEP_BATCHES.get(case))
    return weights, batch


def case_steps(case, steps):
    """The number of optimizer steps a case runs (MAX_STEPS caps some)."""
    return min(steps, MAX_STEPS.get(case, steps))


def run_reference(cfg_dict, weights, batch, steps, dtype=torch.float64):
    """The PyTorch side of the parity interface: returns the dict jtok writes to O.safetensors
    (as float64 numpy arrays)."""
    mcfg = JTokConfig.from_dict(cfg_dict)
    tcfg = TrainConfig.from_dict(cfg_dict)
    model = Transformer(mcfg).to(dtype)
    model.load_numpy({k: v.astype(np.float64) for k, v in weights.items()})
    out = {}
    with torch.no_grad():
        out["logits"] = model(step_micro_batches(batch, 0)[0][0])[..., :mcfg.vocab_size].double().numpy()

    rows_with_grad = {}  # table name -> per step, bool (Vp) rows with a nonzero gradient

    def keep_step0_grads(step, m):
        if step == 0:
            for name, p in m.named_parameters():
                out["grad." + name] = p.grad.double().numpy().copy()
        for name, p in m.named_parameters():
            if is_table(name):
                rows_with_grad.setdefault(name, []).append(p.grad.abs().sum(dim=1).numpy() > 0)

    log = train_steps(model, lambda step: step_micro_batches(batch, step), tcfg, steps,
                      on_gradients=keep_step0_grads)
    for key in ("loss", "grad_norm", "lr"):
        out[key] = np.array(log[key], dtype=np.float64)
    if mcfg.moe_num_layers > 0:
        out["aux_loss"] = np.array(log["aux_loss"], dtype=np.float64)
    if mcfg.jtokm_num_layers > 0:
        out["jtokm_aux_loss"] = np.array(log["jtokm_aux_loss"], dtype=np.float64)
    for name, p in model.named_parameters():
        out["final." + name] = p.detach().double().numpy().copy()
    for name, rows in rows_with_grad.items():
        out["rowgrad." + name] = np.stack(rows)  # (steps, Vp) bool; not an output jtok writes
    return out


def write_inputs(workdir, cfg_dict, weights, batch):
    paths = {k: os.path.join(workdir, f) for k, f in
             (("config", "config.json"), ("weights", "weights.safetensors"),
              ("batch", "batch.safetensors"), ("out", "out.safetensors"))}
    with open(paths["config"], "w") as f:
        json.dump(cfg_dict, f, indent=1)
    safetensors_np.save(paths["weights"], weights)
    safetensors_np.save(paths["batch"], batch)
    return paths


def jtok_has_parity(jtok_bin):
    if not jtok_bin or not os.path.exists(jtok_bin):
        return False
    r = subprocess.run([jtok_bin, "parity", "--help"], capture_output=True, text=True)
    return r.returncode == 0


def run_jtok(jtok_bin, cfg_dict, weights, batch, steps, workdir):
    paths = write_inputs(workdir, cfg_dict, weights, batch)
    cmd = [jtok_bin, "parity", "--config", paths["config"], "--weights", paths["weights"],
           "--batch", paths["batch"], "--steps", str(steps), "--out", paths["out"]]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return safetensors_np.load(paths["out"])


def rel_err(a, b):
    """||a - b|| / ||b|| (b is the reference); 0 when both are zero."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shape {a.shape} != reference shape {b.shape}")
    nb = np.linalg.norm(b)
    diff = np.linalg.norm(a - b)
    return diff / nb if nb > 0 else diff


def compare(out, ref):
    """Rows (name, rel err) for every tensor of the reference output, in a stable order."""
    missing = sorted(k for k in set(ref) - set(out) if not k.startswith("rowgrad."))
    if missing:
        raise KeyError(f"output lacks {missing}")
    order = ["logits", "loss"] + [k for k in ("aux_loss", "jtokm_aux_loss") if k in ref] + ["grad_norm", "lr"]
    order += sorted(k for k in ref if k.startswith("grad."))
    order += sorted(k for k in ref if k.startswith("final."))
    return [(name, rel_err(out[name], ref[name])) for name in order]


def tolerance(name):
    for prefix, tol in TOL.items():
        if name == prefix or (prefix.endswith(".") and name.startswith(prefix)):
            return tol
    raise KeyError(name)


def check_outputs(case, cfg_dict, out, ref, label, steps):
    """Prints the error table of `out` against the reference `ref` and returns a list of failure
    messages (empty when the case passes): thresholds of TOL, padded head rows, clipping."""
    cfg = JTokConfig.from_dict(cfg_dict)
    failures = []
    rows = compare(out, ref)
    width = max(len(n) for n, _ in rows)
    print(f"\n{case}: {label} vs reference (float64), {steps} steps")
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

    failures += check_table_rows(case, cfg, out, ref, steps)

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


def row_patterns(has_grad):
    """Classes of table rows by the steps at which they had a gradient (has_grad: (steps, rows)
    bool): "never", "every" step, "comeback" (a gradient, then at least one step without, then a
    gradient again: the deferred optimizer replays the missed steps before the new update), and
    "other" (a gradient at some steps, not again after a gap)."""
    steps = has_grad.shape[0]
    idx = np.arange(steps)[:, None]
    first = np.where(has_grad.any(0), np.argmax(has_grad, axis=0), steps)
    last = np.where(has_grad.any(0), steps - 1 - np.argmax(has_grad[::-1], axis=0), -1)
    count = has_grad.sum(0)
    # A gap between the first and the last step with a gradient: fewer gradients than steps spanned.
    comeback = (count > 0) & (count < last - first + 1)
    return {"never": count == 0, "every": count == steps, "comeback": comeback,
            "other": (count > 0) & (count < steps) & ~comeback}


def check_table_rows(case, cfg, out, ref, steps):
    """Final token-indexed tables compared row by row (a whole-tensor error dilutes one wrong row
    by the table's size): the worst ||ours_r - ref_r|| / ||ref_r|| over real rows must stay within
    TOL["table_row_never"] for rows that never had a gradient and TOL["table_row"] for the others;
    printed per class of row_patterns. Cases of COMEBACK_CASES must have rows
    that come back after a gap in every table (else they would not test the deferred replay)."""
    failures = []
    V = cfg.vocab_size
    for name in sorted(k[len("final."):] for k in ref if k.startswith("final.") and is_table(k)):
        a, b = out["final." + name][:V].astype(np.float64), ref["final." + name][:V]
        err = np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)
        pats = row_patterns(ref["rowgrad." + name][:, :V])
        parts = [f"{k} {int(m.sum())}: {err[m].max():.1e}" for k, m in pats.items() if m.any()]
        print(f"  rows of {name}: worst by class {', '.join(parts)}")
        for kind, rows in (("table_row_never", pats["never"]), ("table_row", ~pats["never"])):
            if not rows.any():
                continue
            worst = int(np.flatnonzero(rows)[np.argmax(err[rows])])
            if err[worst] > TOL[kind]:
                failures.append(f"{case}: final.{name} row {worst} ({'never had a gradient' if kind == 'table_row_never' else 'had a gradient'}) "
                                f"rel err {err[worst]:.3e} > {TOL[kind]:.0e}")
        if case in COMEBACK_CASES and not pats["comeback"].any():
            failures.append(f"{case}: {name} has no row that comes back after steps without a gradient")
    return failures


def run_parity_test(cases, steps, extra_checks=None):
    """The body of a parity test: for each case, jtok ($JTOK_BIN) against the reference from the
    same weights and batch; `extra_checks(case, cfg_dict, weights, batch, out, ref)` may add
    failure messages. Returns the exit code: 1 (and FAILED) on any failure, and also when
    $JTOK_BIN has no `parity` command (never a skip)."""
    jtok_bin = os.environ.get("JTOK_BIN")
    if not jtok_has_parity(jtok_bin):
        print(f"FAILED: {jtok_bin or '$JTOK_BIN'} has no `parity` command")
        return 1
    failures = []
    for case, cfg_dict in cases.items():
        n = case_steps(case, steps)
        weights, batch = case_inputs(case, cfg_dict)
        ref = run_reference(cfg_dict, weights, batch, n)
        with tempfile.TemporaryDirectory() as tmp:
            out = run_jtok(jtok_bin, cfg_dict, weights, batch, n, tmp)
        failures += check_outputs(case, cfg_dict, out, ref, "jtok (float32)", n)
        if extra_checks is not None:
            failures += extra_checks(case, cfg_dict, weights, batch, out, ref)
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nOK")
    return 0


def format_table(rows, title):
    width = max(len(n) for n, _ in rows)
    lines = [title, f"  {'tensor'.ljust(width)}  rel err"]
    lines += [f"  {n.ljust(width)}  {e:.2e}" for n, e in rows]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jtok", default=os.environ.get("JTOK_BIN"), help="jtok binary (default $JTOK_BIN)")
    ap.add_argument("--case", default="all", choices=["all"] + list(ALL_CASES))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--self", action="store_true", help="compare reference float32 vs float64 only")
    args = ap.parse_args()
    torch.set_num_threads(1)  # tiny tensors: threads only add OpenMP waits
    use_jtok = not args.self and jtok_has_parity(args.jtok)
    for name in (ALL_CASES if args.case == "all" else [args.case]):
        cfg_dict = ALL_CASES[name]
        steps = case_steps(name, args.steps)
        weights, batch = case_inputs(name, cfg_dict)
        ref = run_reference(cfg_dict, weights, batch, steps)
        if use_jtok:
            with tempfile.TemporaryDirectory() as tmp:
                out = run_jtok(args.jtok, cfg_dict, weights, batch, steps, tmp)
            title = f"{name}: jtok (float32) vs reference (float64)"
        else:
            out = run_reference(cfg_dict, weights, batch, steps, dtype=torch.float32)
            title = f"{name}: reference float32 vs reference float64"
        print(format_table(compare(out, ref), title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
