#!/usr/bin/env bash
# isoFLOPs on the CPU, MoE vs MoE+JTok-M (issue 15 item 1; the paper's Figure 6a and Appendix C).
# docs/results.md, "isoFLOPs on the CPU: MoE vs MoE+JTok-M", has the design and the results.
#   scripts/exp_isoflops_moe.sh [--out DIR] [--budgets LIST] [--max-tokens N] [--min-steps N]
#                               [--workers N] [--bootstrap N] [--data-dir D] [--fig-dir F] [--fit-only|--status]
# --status: plan, restore committed rows, rewrite the CSVs and list the runs still to do; trains nothing.
# - Data: our own 5,184-token BPE (data_bpe5k/, made here by scripts/prepare_data.sh when missing;
#   deterministic), so that JTok-M's n_e = d/8 tables give eta = 49.8 on every shape.
# - Plan: configs/isoflops_moe.json (MoE) and configs/isoflops_jtokm.json (+JTok-M, n_e = d/8,
#   K = d/32 on every layer: eta 49.8, rho 0.25), shapes configs/isoflops_moe_shapes.json; a shape
#   is left out of a budget when it would train fewer than --min-steps steps or on more than
#   --max-tokens tokens (default 2.23e7: 4 passes over the 5.57M training tokens; docs/results.md
#   says why the study cannot stay within one epoch). Defaults: budgets 3e11,1e12,3e12, min 400 steps.
# - Runs: one queue of single runs, both variants interleaved in budget order (smallest first),
#   served by --workers processes of one thread each (`nice -n 19`). Resumable: a run with a
#   result.json in OUT is done; a stopped run resumes from its checkpoint; a run whose row is
#   already in the committed CSV (docs/data/cpu_moe.csv, docs/data/cpu_moe_jtokm.csv) is restored
#   from it, so the study continues on another machine from the committed rows. Each finished run
#   rewrites its variant's CSV at once (atomically); rows of runs not in the current plan (other
#   budgets or filters) are dropped from it.
# - Fit (when every budget has >= 3 runs of both variants): per-budget quadratic minima, both
#   frontiers log2 L = alpha log10 C + beta, the compute saving (separate and shared slope) with a
#   bootstrap interval over runs, the best-run frontier, SVGs under docs/figures/isoflops_moe*/.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=runs/isoflops_moe; BUDGETS=3e11,1e12,3e12; MAX_TOKENS=2.23e7; MIN_STEPS=400; WORKERS=2; BOOT=1000; FIT_ONLY=0; STATUS=0
DATA=docs/data; FIG=docs/figures
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --budgets) BUDGETS=$2; shift 2 ;;
    --max-tokens) MAX_TOKENS=$2; shift 2 ;;
    --min-steps) MIN_STEPS=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --bootstrap) BOOT=$2; shift 2 ;;
    --data-dir) DATA=$2; shift 2 ;;
    --fig-dir) FIG=$2; shift 2 ;;
    --fit-only) FIT_ONLY=1; shift ;;
    --status) STATUS=1; shift ;;
    *) echo "usage: $0 [--out DIR] [--budgets LIST] [--max-tokens N] [--min-steps N] [--workers N] [--bootstrap N] [--data-dir D] [--fig-dir F] [--fit-only|--status]" >&2; exit 2 ;;
  esac
done
PY=/usr/bin/python3
JTOK=${JTOK_BIN:-build/jtok}
[ -x "$JTOK" ] || { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null && cmake --build build -j2 --target jtok; }
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
VARIANTS=(moe jtokm)
declare -A CFG=([moe]=configs/isoflops_moe.json [jtokm]=configs/isoflops_jtokm.json)
declare -A CSV=([moe]=$DATA/cpu_moe.csv [jtokm]=$DATA/cpu_moe_jtokm.csv)
mkdir -p "$OUT" "$DATA"

# Writes a variant's CSV from the result.json files in OUT/<variant>/ (plus rows of the committed
# CSV that this machine has no result.json for), only runs of the current plan, sorted by budget
# and N_c; atomic.
merge_csv() {
  local v=$1
  ( flock 9
    "$PY" - "$OUT/$v" "${CSV[$v]}" <<'PY'
import csv, glob, json, os, sys
out_dir, path = sys.argv[1], sys.argv[2]
cols = ["run_id", "budget", "shape", "n_c", "n_n", "eta", "tokens", "steps", "compute", "loss", "seconds"]
planned = {r["run_id"] for r in json.load(open(os.path.join(out_dir, "plan.json")))["rows"]}
rows = {}
if os.path.exists(path):
    for r in csv.DictReader(open(path)):
        if r["run_id"] in planned: rows[r["run_id"]] = r
for f in glob.glob(os.path.join(out_dir, "*", "result.json")):
    j = json.load(open(f))
    if j["run_id"] not in planned: continue
    rows[j["run_id"]] = {"run_id": j["run_id"], "budget": f"{j['budget']:g}", "shape": j["shape"], "n_c": j["n_c"],
                         "n_n": j["n_n"], "eta": f"{j['n_n'] / j['n_c']:.6g}", "tokens": j["tokens"], "steps": j["steps"],
                         "compute": f"{j['compute']:.6g}", "loss": f"{j['loss']:.6f}", "seconds": f"{j.get('seconds', 0):.1f}"}
with open(path + ".tmp", "w") as fh:
    fh.write(",".join(cols) + "\n")
    for r in sorted(rows.values(), key=lambda r: (float(r["budget"]), int(r["n_c"]))):
        fh.write(",".join(str(r[c]) for c in cols) + "\n")
    fh.flush(); os.fsync(fh.fileno())
os.replace(path + ".tmp", path)
PY
  ) 9> "$OUT/$v.csv.lock"
}

if [ $FIT_ONLY = 0 ]; then
  # The corpus of our own tokenizer (same bytes as data/, 5,184-token BPE trained on its training split).
  if [ -z "$(ls data_bpe5k/train/*.bin 2>/dev/null)" ]; then
    bash scripts/prepare_data.sh --tokenizer-dir data_bpe5k/tokenizer --vocab-size 5184 --out data_bpe5k
  fi
  RUNJ=$JTOK
  for v in "${VARIANTS[@]}"; do
    mkdir -p "$OUT/$v/plans"
    "$RUNJ" scaling plan --config "${CFG[$v]}" --shapes configs/isoflops_moe_shapes.json --budgets "$BUDGETS" \
      --max-tokens "$MAX_TOKENS" --min-steps "$MIN_STEPS" --out "$OUT/$v/plan.json" --csv "$OUT/$v/plan.csv"
    # One plan file per run, and result.json restored from committed rows of the same run.
    "$PY" - "$OUT/$v" "${CSV[$v]}" <<'PY'
import csv, json, os, sys
d, path = sys.argv[1], sys.argv[2]
plan = json.load(open(f"{d}/plan.json"))
done = {r["run_id"]: r for r in csv.DictReader(open(path))} if os.path.exists(path) else {}
for r in plan["rows"]:
    p = dict(plan, rows=[r], budgets=[r["budget"]])
    f = f"{d}/plans/{r['run_id']}.json"
    with open(f + ".tmp", "w") as fh: json.dump(p, fh, indent=1)
    os.replace(f + ".tmp", f)  # atomic: a worker of a running study may be reading it
    res = f"{d}/{r['run_id']}/result.json"
    c = done.get(r["run_id"])
    if c and not os.path.exists(res):
        if int(c["steps"]) != r["steps"] or int(c["n_c"]) != r["n_c"]:
            sys.exit(f"{path}: row {r['run_id']} has steps {c['steps']} / n_c {c['n_c']}, the plan {r['steps']} / {r['n_c']}: "
                     "the committed rows come from another design; move that CSV away to start over")
        os.makedirs(os.path.dirname(res), exist_ok=True)
        j = {"run_id": r["run_id"], "budget": r["budget"], "shape": r["shape"], "n_c": r["n_c"], "n_n": r["n_n"],
             "tokens": r["tokens"], "steps": r["steps"], "compute": r["compute"], "loss": float(c["loss"]),
             "seconds": float(c.get("seconds") or 0), "restored_from": path}
        with open(res + ".tmp", "w") as f: json.dump(j, f, indent=2)
        os.replace(res + ".tmp", res)
        print(f"restored {r['run_id']} from {path}")
PY
  done
  # The queue: both variants' runs interleaved, smallest budget first.
  "$PY" - "$OUT" "${VARIANTS[@]}" > "$OUT/queue.txt" <<'PY'
import json, sys
out, vs = sys.argv[1], sys.argv[2:]
plans = {v: json.load(open(f"{out}/{v}/plan.json"))["rows"] for v in vs}
# Within a budget the longest runs first, so that two workers end close together.
keys = sorted({(r["budget"], -r["tokens"], i) for v in vs for i, r in enumerate(plans[v])})
for b, _, i in keys:
    for v in vs:
        if i < len(plans[v]) and plans[v][i]["budget"] == b: print(v, plans[v][i]["run_id"])
PY
  if [ $STATUS = 1 ]; then
    for v in "${VARIANTS[@]}"; do merge_csv "$v"; done
    todo=0
    while read -r v id; do [ -f "$OUT/$v/$id/result.json" ] || { echo "to do: $v $id"; todo=$((todo + 1)); }; done < "$OUT/queue.txt"
    echo "exp_isoflops_moe: $todo of $(wc -l < "$OUT/queue.txt") runs still to do; rows in ${CSV[moe]}, ${CSV[jtokm]}"
    exit 0
  fi
  # The binary is copied so that a rebuild during the study does not change the trainer under it.
  cp "$JTOK" "$OUT/jtok.bin.tmp" && mv "$OUT/jtok.bin.tmp" "$OUT/jtok.bin"
  RUNJ=$OUT/jtok.bin
  echo 0 > "$OUT/queue.next"
  NJOBS=$(wc -l < "$OUT/queue.txt")
  echo "exp_isoflops_moe: $NJOBS runs in the queue ($OUT/queue.txt), $WORKERS worker(s) of one thread; load $(cut -d' ' -f1-3 /proc/loadavg)"
  start=$(date +%s)
  worker() {
    local w=$1 i v id rc=0
    while :; do
      i=$( ( flock 9; n=$(cat "$OUT/queue.next"); echo $((n + 1)) > "$OUT/queue.next"; echo "$n" ) 9> "$OUT/queue.lock")
      [ "$i" -lt "$NJOBS" ] || break
      read -r v id < <(sed -n "$((i + 1))p" "$OUT/queue.txt")
      if [ -f "$OUT/$v/$id/result.json" ]; then continue; fi
      echo "[$(date +%H:%M:%S)] worker $w: $v $id (load $(cut -d' ' -f1 /proc/loadavg))"
      if OMP_NUM_THREADS=1 nice -n 19 "$RUNJ" scaling run --plan "$OUT/$v/plans/$id.json" --out "$OUT/$v" \
           --results "$OUT/$v/last_run.$w.csv" --remove-checkpoints >> "$OUT/$v/run.log" 2>&1; then
        merge_csv "$v"
        echo "[$(date +%H:%M:%S)] worker $w: $v $id loss $("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['loss'])" "$OUT/$v/$id/result.json")"
      else
        rc=1; echo "[$(date +%H:%M:%S)] worker $w: $v $id FAILED (see $OUT/$v/$id/train.log)"
      fi
    done
    return $rc
  }
  pids=()
  for w in $(seq 1 "$WORKERS"); do worker "$w" & pids+=($!); done
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  echo "exp_isoflops_moe: runs took $(( $(date +%s) - start )) s (exit $rc)"
  [ $rc = 0 ] || exit 1
  for v in "${VARIANTS[@]}"; do merge_csv "$v"; done
fi

# --- fits and pictures, from the committed CSVs alone ---
for v in "${VARIANTS[@]}"; do [ -f "${CSV[$v]}" ] || { echo "exp_isoflops_moe: ${CSV[$v]} missing: nothing to fit" >&2; exit 1; }; done
enough=$("$PY" - "${CSV[moe]}" "${CSV[jtokm]}" <<'PY'
import csv, sys
from collections import Counter
ok = True
for p in sys.argv[1:]:
    c = Counter(r["budget"] for r in csv.DictReader(open(p)))
    ok &= len(c) >= 3 and all(n >= 3 for n in c.values())
print(1 if ok else 0)
PY
)
[ "$enough" = 1 ] || { echo "exp_isoflops_moe: fewer than 3 budgets with >= 3 runs per variant so far; no fit"; exit 0; }
mkdir -p "$FIG/isoflops_moe" "$FIG/isoflops_moe_best"
FIT=${JTOK_BIN:-build/jtok}
"$FIT" scaling fit --isoflops "${CSV[moe]}" --isoflops "${CSV[jtokm]}" --svg-dir "$FIG/isoflops_moe" \
  --bootstrap "$BOOT" --json > "$DATA/isoflops_moe_fit.json.tmp"
mv "$DATA/isoflops_moe_fit.json.tmp" "$DATA/isoflops_moe_fit.json"
"$FIT" scaling fit --isoflops "${CSV[moe]}" --isoflops "${CSV[jtokm]}" --bootstrap "$BOOT"
echo "the same, bootstrap of the quadratics' residuals:"
"$FIT" scaling fit --isoflops "${CSV[moe]}" --isoflops "${CSV[jtokm]}" --bootstrap "$BOOT" --bootstrap-method residuals | sed -n "/^bootstrap/,\$p" || echo "(residual bootstrap not possible: a profile has fewer than 4 runs)"
"$PY" - "$DATA/isoflops_moe_fit.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
n = bad = 0
for iso in j["isoflops"]:
    for m in iso["minima"]:
        n += 1
        interior = m["method"] == "quadratic" and not m["extrapolated"]
        bad += not interior
        if not interior: print(f"  NOT interior: {iso['file']} C {m['budget']:g} ({m['method']}, extrapolated {m['extrapolated']})")
print(f"interior minima: {n - bad} of {n} profiles")
PY
# Second view of the frontier that needs no quadratic: the best run per budget.
for v in "${VARIANTS[@]}"; do
  "$PY" scripts/isoflops_best.py "${CSV[$v]}" "${CSV[$v]%.csv}_best.csv"
done
"$FIT" scaling fit --frontier "${CSV[moe]%.csv}_best.csv" --frontier "${CSV[jtokm]%.csv}_best.csv" \
  --svg-dir "$FIG/isoflops_moe_best" --json > "$DATA/isoflops_moe_best_fit.json.tmp"
mv "$DATA/isoflops_moe_best_fit.json.tmp" "$DATA/isoflops_moe_best_fit.json"
echo "best run per budget:"
"$FIT" scaling fit --frontier "${CSV[moe]%.csv}_best.csv" --frontier "${CSV[jtokm]%.csv}_best.csv"
