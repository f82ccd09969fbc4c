#!/usr/bin/env python3
"""The ablation tables (issue 15, item 4) from the CSVs alone (scripts/study_ablate.sh).

norm: per (config, steps) of the jtok_nonorm rows, per seed the validation loss of the baseline
CSV's `base` and `jtok` rows (same config, seed, steps; "-" when missing) beside jtok_nonorm's,
and the gap jtok_nonorm - jtok with mean and sd (n - 1) when >= 2 seeds have it.
lambda: per (config, steps) of the jtokm_lambda<L> rows, one line per (lambda, seed): validation
loss, the gap to the baseline CSV's `moe` row, the load fraction per table, the smallest load of
any table in any layer, JTok-M's aux loss (lambda included, as logged) and aux / lambda (the
balance term alone: 1 when the router's probabilities and loads are uniform). lambda
--default-lambda (the configs' 1e-4) is the baseline CSV's `jtokm` row unless the ablation CSV has
its own row for it; the baseline CSV has no load columns, so that line has none.
  study_ablate_report.py ABLATIONS_CSV [--baseline docs/data/seeds.csv] [--default-lambda 1e-4]
"""
import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from study_seeds_report import paired_t  # noqa: E402


def read(path, need):
    if not os.path.exists(path):
        sys.exit(f"study_ablate_report: {path}: no such file")
    with open(path) as f:
        rd = csv.DictReader(f)
        rows = list(rd)
        cols = rd.fieldnames or []
    for c in need:
        if c not in cols:
            sys.exit(f"study_ablate_report: {path}: no column '{c}'")
    return rows


def fmt(x, spec=".4f"):
    return "-" if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--baseline", default="docs/data/seeds.csv")
    ap.add_argument("--default-lambda", default="1e-4")
    a = ap.parse_args()
    key = ["config", "variant", "seed", "steps", "val_loss"]
    rows = read(a.csv, key + ["knob", "knob_value", "jtokm_aux", "load", "load_min"])
    base = read(a.baseline, key) if os.path.exists(a.baseline) else []
    if not rows:
        sys.exit(f"study_ablate_report: {a.csv}: no rows")
    loss = {}
    for r in base:
        loss[(r["config"], r["steps"], r["variant"], r["seed"])] = float(r["val_loss"])

    # An ablated variant per seed beside the baseline CSV's two rows of that seed: `ref` (the same
    # model with the knob on) and `plain` (without tables, headed plain_label); the gap to ref, mean
    # +- sd over seeds.
    def beside_baselines(abl, plain, plain_label, ref, name, short, with_p):
        print(f"| config | steps | seed | {plain_label} | {ref} | {name} | {short} - {ref} | {short} - {plain_label} |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for cfg, steps in sorted({(r["config"], r["steps"]) for r in abl}):
            gaps = []
            for r in sorted((r for r in abl if (r["config"], r["steps"]) == (cfg, steps)), key=lambda r: int(r["seed"])):
                b = loss.get((cfg, steps, plain, r["seed"]))
                j = loss.get((cfg, steps, ref, r["seed"]))
                x = float(r["val_loss"])
                if j is not None:
                    gaps.append(x - j)
                print(f"| {cfg} | {steps} | {r['seed']} | {fmt(b)} | {fmt(j)} | {x:.4f} | "
                      f"{fmt(x - j if j is not None else None, '+.4f')} | {fmt(x - b if b is not None else None, '+.4f')} |")
            if len(gaps) >= 2:
                m, sd, _, _, p = paired_t(gaps)
                ps = f", paired t p {p:.2g}" if with_p and p is not None else ""
                print(f"| {cfg} | {steps} | mean +- sd ({len(gaps)} seeds){ps} | | | | **{m:+.4f} +- {sd:.4f}** | |")
        print()

    norm = [r for r in rows if r["knob"] == "jtok_norm"]
    if norm:
        beside_baselines(norm, "base", "base", "jtok", "jtok_nonorm", "nonorm", with_p=False)
    depth = [r for r in rows if r["knob"] == "jtokm_depth_scaling"]
    if depth:
        beside_baselines(depth, "moe", "MoE", "jtokm", "jtokm_noscale", "noscale", with_p=True)

    lam = [r for r in rows if r["knob"] == "jtokm_aux_loss_coef"]
    if lam:
        print("| config | steps | lambda | seed | val loss | - MoE | load per table (last 50 steps, mean over layers) | min load | aux loss | aux / lambda |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        dl = float(a.default_lambda)
        for cfg, steps in sorted({(r["config"], r["steps"]) for r in lam}):
            lines = {}
            for r in lam:
                if (r["config"], r["steps"]) == (cfg, steps):
                    lines[(float(r["knob_value"]), int(r["seed"]))] = r
            for (cfg2, st, v, s), x in loss.items():  # the default lambda: the seeds study's jtokm row
                if (cfg2, st, v) == (cfg, steps, "jtokm") and (dl, int(s)) not in lines:
                    lines[(dl, int(s))] = {"seed": s, "val_loss": str(x), "load": "", "load_min": "", "jtokm_aux": "",
                                           "from": "baseline"}
            for (l, s) in sorted(lines):
                r = lines[(l, s)]
                x = float(r["val_loss"])
                moe = loss.get((cfg, steps, "moe", str(s)))
                aux = float(r["jtokm_aux"]) if r["jtokm_aux"] else None
                load = " ".join(r["load"].split(";")) if r["load"] else "- (not recorded)"
                src = " (seeds row)" if r.get("from") == "baseline" else ""
                print(f"| {cfg} | {steps} | {l:g}{src} | {s} | {x:.4f} | {fmt(x - moe if moe is not None else None, '+.4f')} | "
                      f"{load} | {r['load_min'] or '-'} | {fmt(aux, '.3g')} | {fmt(aux / l if aux is not None and l > 0 else None, '.3f')} |")
            # Each lambda against the default at the same seed (paired): the seeds both have.
            pairs = []
            for l in sorted({l for l, _ in lines if l != dl}):
                seeds = sorted(s for l2, s in lines if l2 == l and (dl, s) in lines)
                gaps = [float(lines[(l, s)]["val_loss"]) - float(lines[(dl, s)]["val_loss"]) for s in seeds]
                if gaps:
                    pairs.append((l, seeds, gaps))
            if pairs:
                print()
                print(f"| config | steps | lambda | seeds | minus lambda {dl:g}, per seed | mean +- sd | t (df) | p, paired t |")
                print("| --- | --- | --- | --- | --- | --- | --- | --- |")
                for l, seeds, gaps in pairs:
                    per = " ".join(f"{g:+.4f}" for g in gaps)
                    m, sd, _, t, p_t = paired_t(gaps)
                    if t is not None:
                        stats = f"**{m:+.4f} +- {sd:.4f}** | {t:.2f} ({len(gaps) - 1}) | {p_t:.2g}"
                    else:
                        stats = f"**{gaps[0]:+.4f}** | - | -"
                    print(f"| {cfg} | {steps} | {l:g} | {','.join(map(str, seeds))} | {per} | {stats} |")
        print()


if __name__ == "__main__":
    main()
