#!/usr/bin/env python3
"""The table of bench/gpu_study.sh's CSV (issue 39's "Beyond"), markdown on stdout.

One table per (config, steps, batch, device, precision): a row per variant with its held-out loss at
each seed, the mean, its gap to dense at the same seed (negative: lower loss than dense) and the
mean gap over the seeds both have, tokens/s (the mean of its runs' medians) and its ratio to dense's.
    python3 bench/gpu_study_report.py study.csv
"""
import csv
import sys
from collections import defaultdict

ORDER = {"dense": 0, "jtok": 1, "jtokm": 2}
LABEL = {"dense": "dense", "jtok": "+JTok", "jtokm": "+JTok-M (n_e 5, K 2)"}


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def table(key, rows):
    config, steps, batch, device, precision = key
    by = defaultdict(dict)  # variant -> seed -> row
    for r in rows:
        by[r["variant"]][int(r["seed"])] = r  # a later row of the same run replaces an earlier one
    seeds = sorted({s for v in by.values() for s in v})
    dense = by.get("dense", {})
    dense_tps = mean([float(r["tok_s"]) for r in dense.values()])
    tokens = sorted({int(r["tokens"]) for v in by.values() for r in v.values()})
    gpus = sorted({r["gpu"] for v in by.values() for r in v.values()})
    commits = sorted({r["commit"] for v in by.values() for r in v.values()})
    val_tokens = sorted({int(r["val_tokens"]) for v in by.values() for r in v.values()})
    out = [f"### {config}, {steps} steps of {batch} sequences ({', '.join(map(str, tokens))} tokens), "
           f"{device} {precision} on {', '.join(gpus)}", "",
           f"Held-out loss over {', '.join(map(str, val_tokens))} validation tokens; commits {', '.join(commits)}.", ""]
    head = ["variant"] + [f"val loss s{s}" for s in seeds] + ["mean"] + [f"gap s{s}" for s in seeds]
    head += ["mean gap", "tokens/s", "/ dense", "peak GiB"]
    out += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for v in sorted(by, key=lambda v: (ORDER.get(v, 9), v)):
        runs = by[v]
        cells = [LABEL.get(v, v)]
        cells += [f"{float(runs[s]['val_loss']):.4f}" if s in runs else "-" for s in seeds]
        cells.append(f"{mean([float(r['val_loss']) for r in runs.values()]):.4f}")
        gaps = {s: float(runs[s]["val_loss"]) - float(dense[s]["val_loss"]) for s in seeds if s in runs and s in dense}
        cells += [f"{gaps[s]:+.4f}" if s in gaps else "-" for s in seeds]
        cells.append(f"{mean(list(gaps.values())):+.4f}" if gaps else "-")
        tps = mean([float(r["tok_s"]) for r in runs.values()])
        cells += [f"{tps:,.0f}", f"{tps / dense_tps:.3f}" if dense else "-"]
        peaks = [float(r["peak_gpu_gib"]) for r in runs.values() if r["peak_gpu_gib"]]
        cells.append(f"{max(peaks):.2f}" if peaks else "-")
        out.append("| " + " | ".join(cells) + " |")
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gpu_study_report.py STUDY.csv")
    groups = defaultdict(list)
    with open(sys.argv[1], newline="") as f:
        for r in csv.DictReader(f):
            groups[(r["config"], int(r["steps"]), int(r["batch"]), r["device"], r["precision"])].append(r)
    if not groups:
        print("gpu_study: no finished run yet")
        return
    lines = []
    for key in sorted(groups):
        lines += table(key, groups[key]) + [""]
    print("\n".join(lines).rstrip())


if __name__ == "__main__":
    main()
