#!/usr/bin/env python3
"""The isoFLOPs frontier that needs no quadratic: per budget the run with the lowest loss (an upper
bound on L*(C); the same as the minimum wherever a profile has no U shape). Shared by
scripts/exp_isoflops.sh and scripts/exp_isoflops_moe.sh.

Reads an isoFLOPs results CSV (columns budget, loss, n_c, shape; `jtok scaling run`'s and the
study scripts' rows) and writes OUT (columns compute, loss, n_c, shape; one row per budget, by
budget) atomically (temp file, fsync, rename), as `jtok scaling fit --frontier` reads it. On a tie
the first row in the file wins.
  isoflops_best.py RESULTS_CSV OUT_CSV
"""
import csv
import os
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: isoflops_best.py RESULTS_CSV OUT_CSV")
    src, out = sys.argv[1], sys.argv[2]
    best = {}
    with open(src) as f:
        rd = csv.DictReader(f)
        missing = [c for c in ("budget", "loss", "n_c", "shape") if c not in (rd.fieldnames or [])]
        if missing:
            sys.exit(f"isoflops_best: {src}: no column {', '.join(repr(c) for c in missing)}")
        for line, r in enumerate(rd, start=2):
            try:
                b, loss = float(r["budget"]), float(r["loss"])
            except ValueError:
                sys.exit(f"isoflops_best: {src}:{line}: budget '{r['budget']}' or loss '{r['loss']}' is not a number")
            if b not in best or loss < float(best[b]["loss"]):
                best[b] = r
    with open(out + ".tmp", "w") as f:
        f.write("compute,loss,n_c,shape\n")
        for b in sorted(best):
            f.write(f"{b:g},{best[b]['loss']},{best[b]['n_c']},{best[b]['shape']}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
