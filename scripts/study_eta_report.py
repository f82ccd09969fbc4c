#!/usr/bin/env python3
"""The eta law from a study CSV (scripts/study_eta.sh), from the CSV alone.

Per (steps, seed): the JTok-M rows (variant jtokm_*) and the MoE row (variant moe, of this CSV or
of --baseline CSV: the seeds study's row of configs/exp_moe.json at that seed and steps). Fits ordinary
least squares val_loss = a + b log2(eta) over all JTok-M rows of a step count (seeds pooled), and
prints b (the loss change per doubling of eta) with its standard error and 95 % Student-t interval
(n - 2 degrees of freedom), beside the paper's -0.0118 per doubling (Figure 7b). Where a step count
has runs of several seeds, also with seed as a fixed effect (fixed_effect_slope: each seed's runs
centred, so a seed that trains worse at every eta shifts its level, not the slope) and per seed.
Prints markdown.
  study_eta_report.py CSV [--baseline docs/data/seeds.csv]
"""
import csv
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from study_seeds_report import mean_sd, t_quantile  # noqa: E402


def fixed_effect_slope(groups):
    """groups: {seed: [(x, y), ...]}. OLS slope of y on x with one intercept per seed: x and y centred
    within each seed, b = sum(xc yc) / sum(xc^2), residual df = n - seeds - 1. Returns (b, se, df),
    or None when there are no residual degrees of freedom or x does not vary within any seed."""
    xc, yc = [], []
    for pts in groups.values():
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        xc += [x - mx for x, _ in pts]
        yc += [y - my for _, y in pts]
    sxx = sum(x * x for x in xc)
    df = len(xc) - len(groups) - 1
    if sxx == 0 or df < 1:
        return None
    b = sum(x * y for x, y in zip(xc, yc)) / sxx
    sse = sum((y - b * x) ** 2 for x, y in zip(xc, yc))
    return b, math.sqrt(sse / df / sxx), df


def ols(pts):
    """Least squares y = a + b x over pts [(x, y), ...]: (a, b, sxx), or None when x does not vary."""
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return my - b * mx, b, sxx


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--baseline", default="")
    a = ap.parse_args()
    path = a.csv
    rows = list(csv.DictReader(open(path)))
    if not rows:
        sys.exit(f"{path}: no rows")
    base = {}
    if a.baseline and os.path.exists(a.baseline):
        for r in csv.DictReader(open(a.baseline)):
            if r["variant"] == "moe" and r["config"] == "configs/exp_moe.json":
                base[(r["steps"], r["seed"])] = float(r["val_loss"])
    base.update({(r["steps"], r["seed"]): float(r["val_loss"]) for r in rows if r["variant"] == "moe"})
    print("| steps | seed | variant | n_n | eta | rho | val loss | minus MoE |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: (int(r["steps"]), int(r["seed"]), float(r["eta"]))):
        b = base.get((r["steps"], r["seed"]))
        d = f"{float(r['val_loss']) - b:+.4f}" if b is not None and r["variant"] != "moe" else ""
        print(f"| {r['steps']} | {r['seed']} | {r['variant']} | {r['n_n']} | {r['eta']} | {r['rho']} | {float(r['val_loss']):.4f} | {d} |")
    print()
    print("| steps | JTok-M runs | eta range | slope per doubling of eta | s.e. | 95 % CI (t, n-2) | R^2 | paper |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for steps in sorted({r["steps"] for r in rows}, key=int):
        pts = [(math.log2(float(r["eta"])), float(r["val_loss"])) for r in rows
               if r["steps"] == steps and r["variant"].startswith("jtokm") and float(r["eta"]) > 0]
        n = len(pts)
        if n < 3:
            print(f"| {steps} | {n} | | (needs 3 runs) | | | | -0.0118 |")
            continue
        fit = ols(pts)
        if fit is None:
            print(f"| {steps} | {n} | one eta | | | | | -0.0118 |")
            continue
        a, b, sxx = fit
        my = sum(y for _, y in pts) / n
        sse = sum((y - a - b * x) ** 2 for x, y in pts)
        syy = sum((y - my) ** 2 for _, y in pts)
        se = math.sqrt(sse / (n - 2) / sxx)
        q = t_quantile(0.975, n - 2)
        r2 = 1 - sse / syy if syy > 0 else float("nan")
        lo, hi = min(x for x, _ in pts), max(x for x, _ in pts)
        print(f"| {steps} | {n} | {2 ** lo:.1f} - {2 ** hi:.1f} | **{b:+.4f}** | {se:.4f} | "
              f"[{b - q * se:+.4f}, {b + q * se:+.4f}] | {r2:.3f} | -0.0118 |")
    fe_lines = []
    for steps in sorted({r["steps"] for r in rows}, key=int):
        groups = {}
        for r in rows:
            if r["steps"] == steps and r["variant"].startswith("jtokm") and float(r["eta"]) > 0:
                groups.setdefault(r["seed"], []).append((math.log2(float(r["eta"])), float(r["val_loss"])))
        groups = {k: v for k, v in groups.items() if len(v) >= 2}
        fe = fixed_effect_slope(groups) if len(groups) >= 2 else None
        if fe is None:
            continue
        b, se, df = fe
        q = t_quantile(0.975, df)
        seeds = sorted(groups, key=int)
        per = [ols(groups[k])[1] for k in seeds]
        m, sd = mean_sd(per)
        qs = t_quantile(0.975, len(per) - 1)
        hs = qs * sd / math.sqrt(len(per))
        fe_lines.append(f"| {steps} | {','.join(seeds)} | **{b:+.4f}** | {se:.4f} | [{b - q * se:+.4f}, {b + q * se:+.4f}] | {df} | "
                        f"{' '.join(f'{x:+.4f}' for x in per)} | {m:+.4f} +- {sd:.4f}, [{m - hs:+.4f}, {m + hs:+.4f}] | -0.0118 |")
    if fe_lines:
        print()
        print("| steps | seeds | slope, seed as fixed effect | s.e. | 95 % CI (t) | df | slope per seed | mean of per-seed slopes +- sd, 95 % CI (t, seeds-1) | paper |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        print("\n".join(fe_lines))


if __name__ == "__main__":
    main()
