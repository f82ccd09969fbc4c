#!/usr/bin/env bash
# A small real isoFLOPs study on the CPU (docs/results.md, "isoFLOPs on the CPU"): dense baseline
# vs +JTok, 3 compute budgets x 6 model shapes (configs/isoflops_shapes.json), GPT-2 tokens from
# data/. Plans, runs (both variants side by side, one thread each; resumable: rerun after an
# interruption and only unfinished runs are trained), fits and draws the pictures.
#   scripts/exp_isoflops.sh [--out DIR] [--budgets 4.6e9,1e10,2.2e10] [--max-tokens 1.2e6] [--fit-only]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=runs/isoflops; BUDGETS=4.6e9,1e10,2.2e10; MAX_TOKENS=1.2e6; FIT_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --budgets) BUDGETS=$2; shift 2 ;;
    --max-tokens) MAX_TOKENS=$2; shift 2 ;;
    --fit-only) FIT_ONLY=1; shift ;;
    *) echo "usage: $0 [--out DIR] [--budgets LIST] [--max-tokens N] [--fit-only]" >&2; exit 2 ;;
  esac
done
. scripts/exp_lib.sh
exp_setup
mkdir -p "$OUT"
start=$(date +%s)
if [ $FIT_ONLY = 0 ]; then
  for v in dense jtok; do
    cfg=configs/isoflops_base.json; [ $v = jtok ] && cfg=configs/isoflops_jtok.json
    mkdir -p "$OUT/$v"
    # --max-tokens guards the wall time: the LM head (6 d Vp FLOPs a token, not in C) makes the
    # smallest shape the slowest; at these budgets no run is left out (d16_L1 at 2.2e10: 1.1M).
    "$JTOK" scaling plan --config $cfg --shapes configs/isoflops_shapes.json --budgets "$BUDGETS" \
      --max-tokens "$MAX_TOKENS" --out "$OUT/$v/plan.json" --csv "$OUT/$v/plan.csv"
  done
  # Both variants at once, one thread each: on 2 cores this beats one after the other with 2
  # threads (the tiny matmuls scale poorly), and an early stop leaves both equally far.
  pids=()
  for v in dense jtok; do
    OMP_NUM_THREADS=1 nice -n 19 "$JTOK" scaling run --plan "$OUT/$v/plan.json" --out "$OUT/$v" \
      --results "$OUT/$v/cpu_$v.csv" --remove-checkpoints > "$OUT/$v/run.log" 2>&1 &
    pids+=($!)
  done
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  echo "exp_isoflops: runs took $(( $(date +%s) - start )) s (exit $rc); logs: $OUT/{dense,jtok}/run.log"
  [ $rc = 0 ] || { tail -n 5 "$OUT"/*/run.log; exit 1; }
fi
mkdir -p docs/data docs/figures/isoflops_cpu docs/figures/isoflops_cpu_best
cp "$OUT/dense/cpu_dense.csv" "$OUT/jtok/cpu_jtok.csv" docs/data/
# Second view of the frontier that needs no quadratic: per budget the run with the lowest loss
# (an upper bound on L*(C); the same as the minimum wherever a profile has no U shape).
for v in dense jtok; do
  /usr/bin/python3 scripts/isoflops_best.py "docs/data/cpu_$v.csv" "docs/data/cpu_${v}_best.csv"
done
"$JTOK" scaling fit --isoflops docs/data/cpu_dense.csv --isoflops docs/data/cpu_jtok.csv \
  --svg-dir docs/figures/isoflops_cpu --json > "$OUT/fit.json.tmp"
mv "$OUT/fit.json.tmp" docs/data/isoflops_cpu_fit.json
"$JTOK" scaling fit --frontier docs/data/cpu_dense_best.csv --frontier docs/data/cpu_jtok_best.csv \
  --svg-dir docs/figures/isoflops_cpu_best --json > "$OUT/fit_best.json.tmp"
mv "$OUT/fit_best.json.tmp" docs/data/isoflops_cpu_best_fit.json
"$JTOK" scaling fit --isoflops docs/data/cpu_dense.csv --isoflops docs/data/cpu_jtok.csv
echo "sensitivity: the quadratic through the 4 runs nearest each budget's lowest loss:"
"$JTOK" scaling fit --isoflops docs/data/cpu_dense.csv --isoflops docs/data/cpu_jtok.csv --window 4
echo "best runs per budget:"
"$JTOK" scaling fit --frontier docs/data/cpu_dense_best.csv --frontier docs/data/cpu_jtok_best.csv
/usr/bin/python3 - "$OUT" <<'PY'
import glob, json, sys
for v in ("dense", "jtok"):
    s = [json.load(open(f)).get("seconds", 0) for f in glob.glob(f"{sys.argv[1]}/{v}/*/result.json")]
    print(f"{v}: {len(s)} runs, {sum(s) / 60:.1f} min of trainer wall time")
PY
