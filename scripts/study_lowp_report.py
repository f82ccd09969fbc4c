#!/usr/bin/env python3
"""Report of the low-precision study (scripts/study_lowp.sh), from its CSVs alone.

  study_lowp_report.py LOWP_CSV EXPORT_CSV [KL_CSV]

Training precision: per variant (base, jtok) and seed, the bf16-trained validation loss against the
fp32-trained one (same seed, steps, tokens); the mean and sample sd of the differences over seeds
and a paired t statistic. Exports: each row's validation-loss change and greedy agreement, and
(KL_CSV) each export's next-token distributions against its fp32 source.
"""
import csv
import math
import os
import sys


def read(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    rows, exports = read(sys.argv[1]), read(sys.argv[2])
    kls = read(sys.argv[3]) if len(sys.argv) == 4 else []
    loss = {(r["variant"], int(r["seed"]), int(r["steps"])): float(r["val_loss"]) for r in rows}
    print("training precision (exp_jtok): validation loss, bf16-trained minus fp32-trained")
    for v in ("base", "jtok"):
        diffs = []
        for (var, seed, steps), l32 in sorted(loss.items()):
            if var != v or (v + "_bf16", seed, steps) not in loss:
                continue
            l16 = loss[(v + "_bf16", seed, steps)]
            diffs.append(l16 - l32)
            print(f"  {v:5s} seed {seed} ({steps} steps): fp32 {l32:.4f}  bf16 {l16:.4f}  diff {l16 - l32:+.4f}")
        if not diffs:
            print(f"  {v}: no paired rows yet")
            continue
        n = len(diffs)
        mean = sum(diffs) / n
        if n > 1:
            sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
            t = mean / (sd / math.sqrt(n)) if sd > 0 else float("inf")
            print(f"  {v}: mean diff {mean:+.4f} +- {sd:.4f} (sd over {n} seeds), paired t {t:+.2f} ({n - 1} df)")
        else:
            print(f"  {v}: diff {mean:+.4f} (1 seed)")
    print("inference exports of the fp32 checkpoints: validation-loss change and greedy agreement (64 new tokens x 4 prompts)")
    for r in exports:
        print(f"  {r['variant']:5s} seed {r['seed']} weights {r['weight_dtype']:4s} tables {r['table_dtype']:4s}: "
              f"val loss {r['val_loss']} (fp32 {r['val_loss_f32']}, {r['delta']}), greedy same prefix "
              f"{r['greedy_same']}/{r['greedy_total']}, {r['file_mb']} MB vs {r['file_mb_f32']} MB")

    if kls:
        print("exports against their fp32 source on the same validation positions (jtok eval --reference)")
        print("| variant | seed | weights | tables | positions | top-1 agreement | KL mean | KL max | log p(target) change, mean | mean abs |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in kls:
            print(f"| {r['variant']} | {r['seed']} | {r['weight_dtype']} | {r['table_dtype']} | {int(r['positions']):,} | "
                  f"{100 * float(r['top1_agreement']):.2f} % | {float(r['kl_mean']):.2e} | {float(r['kl_max']):.2e} | "
                  f"{float(r['dlogp_mean']):+.2e} | {float(r['dlogp_abs_mean']):.2e} |")


if __name__ == "__main__":
    main()
