#!/usr/bin/env bash
# Baseline vs +JTok on the training shards with identical settings, data order and tokens (same
# seed: the loader's batches depend only on the seed and the step). Reports validation loss and
# BLiMP for both and draws the loss curves. Resumable: a finished run is not redone.
#   scripts/exp_jtok.sh [--steps N] [--config C] [--out DIR] [--blimp-limit N] [--extra "--field v ..."]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/exp_lib.sh
CONFIG=configs/exp_jtok.json; OUT=runs/exp_jtok
exp_parse_args "$@"
exp_setup
mkdir -p "$OUT"
exp_train_eval "$OUT/base" --jtok false
exp_train_eval "$OUT/jtok" --jtok true
"$JTOK" plot-curves --run "$OUT/base" --label baseline --run "$OUT/jtok" --label "+JTok" \
  --title "baseline vs +JTok ($(basename "$CONFIG"))" --out "$OUT/curves.svg"
/usr/bin/python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rows = []
for v in ("base", "jtok"):
    e = json.load(open(f"{out}/{v}/eval.json"))
    start = json.loads(open(f"{out}/{v}/log.jsonl").readline())
    f = start.get("flops", {})
    rows.append((v, e["val_loss"], e["val_ppl"], e["blimp"]["accuracy"], e["blimp"]["accuracy_paradigm_mean"],
                 f.get("n_c", 0), f.get("n_n", 0), f.get("eta", 0)))
print(f"{'variant':8} {'val_loss':>9} {'val_ppl':>9} {'BLiMP':>7} {'BLiMP(par.mean)':>15} {'N_c':>10} {'N_n':>11} {'eta':>7}")
for r in rows:
    print(f"{r[0]:8} {r[1]:9.4f} {r[2]:9.2f} {100*r[3]:6.2f}% {100*r[4]:14.2f}% {r[5]:10d} {r[6]:11d} {r[7]:7.2f}")
print(f"delta val_loss (jtok - base): {rows[1][1]-rows[0][1]:+.4f}; delta BLiMP: {100*(rows[1][3]-rows[0][3]):+.2f} points")
PY
