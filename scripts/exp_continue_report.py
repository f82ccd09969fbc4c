#!/usr/bin/env python3
"""The continued-pretraining study's tables (scripts/exp_continue.sh), from its CSV alone.

Per arm: held-out loss per seed, mean, sd, median training tokens/s. Then, per treated arm, the paired
gap against `cont` over the continuation seeds that have both rows, with the paired t-test and the
exact sign-flip p of scripts/study_seeds_report.py (the same statistics as docs/data/seeds.csv's).
With --runs DIR (the study's run directory) also the validation loss the continuations log during
training (the first 16 validation batches every 50 steps, the same for the three arms), paired per
seed and step: a look at runs that have not finished.
  exp_continue_report.py CSV [--runs runs/exp_continue]
"""
import csv
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from study_seeds_report import mean_sd, paired_t, signflip_p, t_quantile  # noqa: E402

ARMS = ("base", "cont", "cont_jtok", "cont_tabl", "cont_c", "cont_jtok_c")
# The arm each treated arm is paired with.
CONTROL = {"cont_jtok": "cont", "cont_tabl": "cont", "cont_jtok_c": "cont_c"}


def logged_val(run_dir):
    """step -> val_loss of a run's log.jsonl (a resumed run may log a step twice: the last counts)."""
    out = {}
    path = os.path.join(run_dir, "log.jsonl")
    if os.path.exists(path):
        for line in open(path):
            j = json.loads(line)
            if j.get("type") == "val":
                out[j["step"]] = j["val_loss"]
    return out


def during_training(runs):
    """Paired gaps of the logged validation losses, per step, over the seeds that have both."""
    vals = {}  # (arm, base seed) -> {step: loss}
    for d in glob.glob(os.path.join(runs, "from_s*_n*", "*_n*")):
        if not os.path.isdir(d):
            continue
        seed = os.path.basename(os.path.dirname(d)).split("_")[1][1:]
        vals[(os.path.basename(d).rsplit("_n", 1)[0], seed)] = logged_val(d)
    print()
    print("| step | gap | base seeds | gap per seed (logged val loss, 16 batches) | mean gap | p, paired t |")
    print("| --- | --- | --- | --- | --- | --- |")
    steps = sorted({s for v in vals.values() for s in v})
    for step in steps:
        for arm, ctl in CONTROL.items():
            seeds = sorted((s for (a, s) in vals if a == arm and step in vals[(a, s)] and step in vals.get((ctl, s), {})), key=int)
            if not seeds:
                continue
            gaps = [vals[(arm, s)][step] - vals[(ctl, s)][step] for s in seeds]
            m, _, _, t, p = paired_t(gaps)
            print(f"| {step} | {arm} - {ctl} | {','.join(seeds)} | {' '.join(f'{g:+.4f}' for g in gaps)} | {m:+.4f} | "
                  f"{f'{p:.2g}' if p is not None else '-'} |")


def main():
    args = sys.argv[1:]
    runs = None
    if len(args) == 3 and args[1] == "--runs":
        runs = args[2]
        args = args[:1]
    if len(args) != 1:
        sys.exit("usage: exp_continue_report.py CSV [--runs DIR]")
    sys.argv = [sys.argv[0]] + args
    rows = list(csv.DictReader(open(sys.argv[1])))
    if not rows:
        sys.exit(f"{sys.argv[1]}: no rows")
    by = {(r["variant"], r["seed"]): r for r in rows}
    print("| arm | steps | seeds | held-out loss per seed | mean | sd | train tokens/s (median per run) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for arm in ARMS:
        rs = sorted((r for r in rows if r["variant"] == arm), key=lambda r: int(r["seed"]))
        if not rs:
            continue
        xs = [float(r["val_loss"]) for r in rs]
        m, sd = mean_sd(xs)
        tps = [int(r["tok_s"]) for r in rs if r["tok_s"]]
        print(f"| {arm} | {rs[0]['steps']} | {','.join(r['seed'] for r in rs)} | {' '.join(f'{x:.4f}' for x in xs)} | "
              f"{m:.4f} | {f'{sd:.4f}' if len(xs) > 1 else '-'} | {' '.join(str(t) for t in tps)} |")
    print()
    print("| gap | seeds | gap per seed | mean gap | sd | 95 % CI (t) | t (df) | p, paired t | p, sign-flip (exact) | tokens/s ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for arm, ctl in CONTROL.items():
        seeds = sorted({s for (v, s) in by if v == arm and (ctl, s) in by}, key=int)
        if not seeds:
            continue
        gaps = [float(by[(arm, s)]["val_loss"]) - float(by[(ctl, s)]["val_loss"]) for s in seeds]
        ratios = [int(by[(arm, s)]["tok_s"]) / int(by[(ctl, s)]["tok_s"]) for s in seeds]
        m, sd, se, t, p = paired_t(gaps)
        n = len(gaps)
        if t is not None:
            q = t_quantile(0.975, n - 1)
            stats = f"{sd:.4f} | [{m - q * se:+.4f}, {m + q * se:+.4f}] | {t:.2f} ({n - 1}) | {p:.2g} | {signflip_p(gaps):.3g}"
        else:
            stats = "- | - | - | - | -"
        print(f"| {arm} - {ctl} | {','.join(seeds)} | {' '.join(f'{g:+.4f}' for g in gaps)} | **{m:+.4f}** | {stats} | "
              f"{sum(ratios) / n:.2f} |")
    if runs:
        during_training(runs)


if __name__ == "__main__":
    main()
