#!/usr/bin/env bash
# Issue 39's "Beyond": a study the CPU cannot do. Config b dense, +JTok and +JTok-M (n_e 5, K 2,
# every layer) trained on the GPU over the whole carried corpus for --steps steps of --batch x 1024
# tokens, at each of --seeds (the seed sets the initialisation and the data order: a seed's runs read
# the same batches), each scored on the held-out split (--val: every validation batch, in training:
# `jtok train --no-checkpoints --validate --set eval_batches=0`, so no checkpoint of tens of GB is
# written). One row per finished run in OUT/study.csv; then bench/gpu_study_report.py's table
# (OUT/study.md): each variant's held-out loss per seed, its gap to dense at the same seed, the mean
# gap, tokens/s and its ratio to dense; and OUT/study.svg (`jtok plot-csv`: loss per seed, a series a
# variant).
#   bash bench/gpu_study.sh --jtok BIN --data SHARDS --val SHARDS --tokenizer DIR --out DIR
#        [--steps 600] [--seeds 1,2] [--variants "dense jtok jtokm"] [--batch 16] [--config F]
#        [--device cuda|loopback|cpu] [--csv FILE] [--budget S] [--set name=value ...] [--dry-run]
# --csv (default docs/data/gpu_study.csv, committed): rows measured before; copied into OUT/study.csv
# first, and a run whose (config, variant, seed, steps, device, precision) is there is skipped, so a
# study cut by its budget continues in the next GPU session once its rows are committed.
# --budget S (default 540): no run starts after S - 30 seconds of the script and a run's limit is what
# is left (a run cut short leaves no row). Order: seed after seed, dense, +JTok, +JTok-M in each, so
# the first seed's comparison comes first. --device loopback / cpu (fp32) with a small --config check
# this script without a GPU (tests/test_gpu_study.sh).
# Time on an H100 / H200 (an estimate, not measured): 600 steps of 16 x 1024 tokens, 9.8M tokens
# (data/train holds 4.86M: about two passes), ~25-45 s a run at 220-400k tokens/s, JTok-M's tables
# (2.3 G fp32 rows with their moments) made and copied ~20-40 s more: ~4-6 min for 6 runs.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
usage="usage: $0 --jtok BIN --data SHARDS --val SHARDS --tokenizer DIR --out DIR [--steps N] [--seeds 1,2] [--variants \"dense jtok jtokm\"] [--batch B] [--config F] [--device cuda|loopback|cpu] [--csv FILE] [--budget S] [--set name=value ...] [--dry-run]"
JTOK=""; DATA=""; VAL=""; TOK=""; OUT=""; STEPS=600; SEEDS=1,2; VARIANTS="dense jtok jtokm"; BATCH=16
CONFIG=configs/bench_b.json; DEVICE=cuda; CSV=docs/data/gpu_study.csv; BUDGET=540; DRY=0; SETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --jtok) JTOK=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --val) VAL=$2; shift 2 ;;
    --tokenizer) TOK=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --seeds) SEEDS=$2; shift 2 ;;
    --variants) VARIANTS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --csv) CSV=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --set) SETS+=(--set "$2"); shift 2 ;;
    --dry-run) DRY=1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
if [ -z "$JTOK" ] || [ -z "$DATA" ] || [ -z "$VAL" ] || [ -z "$TOK" ] || [ -z "$OUT" ]; then echo "$usage" >&2; exit 2; fi
[ "$DRY" = 1 ] || [ -x "$JTOK" ] || { echo "gpu_study.sh: no jtok binary at $JTOK" >&2; exit 2; }
for d in "$DATA" "$VAL"; do [ -d "$d" ] || { echo "gpu_study.sh: no token shards in $d" >&2; exit 2; }; done
[ -f "$TOK/encoder.json" ] || { echo "gpu_study.sh: no gpt2 tokenizer in $TOK (encoder.json)" >&2; exit 2; }
[[ "$STEPS" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_study.sh: --steps must be a positive integer, got '$STEPS'" >&2; exit 2; }
case "$DEVICE" in
  cuda) PRECISION=bf16 ;;
  loopback|cpu) PRECISION=fp32 ;;
  *) echo "gpu_study.sh: --device cuda, loopback or cpu, got '$DEVICE'" >&2; exit 2 ;;
esac
variant_sets() {  # variant_sets NAME: the config overrides of one variant (gpu_train_peer.sh's)
  case "$1" in
    dense) echo "--set jtok=false --set jtokm=false" ;;
    jtok) echo "--set jtok=true --set jtokm=false" ;;
    jtokm) echo "--set jtok=false --set jtokm=true --set jtokm_n_e=5 --set jtokm_top_k=2" ;;
    *) echo "gpu_study.sh: unknown variant '$1' (dense, jtok, jtokm)" >&2; return 1 ;;
  esac
}
for v in $VARIANTS; do variant_sets "$v" > /dev/null || exit 2; done
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
# The binary's commit (gpu_session.sh passes the bundle's), else the tree's.
COMMIT=${STUDY_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
GPU=cpu
[ "$DEVICE" = cuda ] && [ "$DRY" = 0 ] && GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ,)
CFG=$(basename "$CONFIG" .json)
mkdir -p "$OUT/runs"
STUDY=$OUT/study.csv
COLUMNS="config,variant,seed,steps,batch,tokens,device,precision,gpu,val_loss,val_tokens,train_loss_last50,tok_s,peak_gpu_gib,wall_s,commit"
if [ -f "$CSV" ]; then
  [ "$(head -n 1 "$CSV")" = "$COLUMNS" ] || { echo "gpu_study.sh: $CSV has another header than '$COLUMNS'" >&2; exit 2; }
  cp "$CSV" "$STUDY"
elif [ ! -f "$STUDY" ]; then
  echo "$COLUMNS" > "$STUDY"
fi
has_row() { cut -d, -f1-4,7,8 "$STUDY" | grep -qxF -- "$CFG,$1,$2,$STEPS,$DEVICE,$PRECISION"; }

# run_one VARIANT SEED: trains and validates one run (killed when the budget is spent), then appends its row.
run_one() {
  local v=$1 seed=$2 name="$1_s$2" left=$((BUDGET - SECONDS))
  local dir=$OUT/runs/$name
  local dev_sets=(); [ "$DEVICE" = cuda ] && dev_sets=(--set precision=bf16)
  # shellcheck disable=SC2207  # the overrides are words
  local cmd=("$JTOK" train --config "$CONFIG" --out "$dir" --overwrite --device "$DEVICE" "${dev_sets[@]}"
             --seed "$seed" --max-steps "$STEPS" --no-checkpoints --validate --set "micro_batch_size=$BATCH"
             --set eval_batches=0 --set "eval_interval=$STEPS" --set sample_interval=0 --set log_interval=50
             --set "train_data=$DATA" --set "val_data=$VAL" --set "tokenizer_dir=$TOK" $(variant_sets "$v") "${SETS[@]}")
  echo "+ ${cmd[*]} > $dir.log"
  [ "$DRY" = 1 ] && return 0
  if [ "$left" -lt 30 ]; then echo "  $name: not started, the budget is spent ($left s left)"; return 1; fi
  local t0=$SECONDS rc=0
  timeout "$left" "${cmd[@]}" > "$dir.log" 2>&1 || rc=$?
  local wall=$((SECONDS - t0))
  if [ $rc != 0 ]; then
    echo "  $name: $([ $rc = 124 ] && echo "KILLED at the budget's end" || echo "FAILED (rc $rc)") after $wall s:"
    tail -n 5 "$dir.log" | sed 's/^/    /'
    return 1
  fi
  local row
  row=$("$PY" - "$dir" "$CFG" "$v" "$seed" "$STEPS" "$BATCH" "$DEVICE" "$PRECISION" "$GPU" "$wall" "$COMMIT" <<'PY'
import json, re, sys
d, cfg, v, seed, steps, batch, device, precision, gpu, wall, commit = sys.argv[1:]
steps_l, val = {}, None
for line in open(d + "/log.jsonl"):
    j = json.loads(line)
    if j.get("type") == "step": steps_l[j["step"]] = j
    if j.get("type") == "val": val = j
if val is None or val["step"] != int(steps): sys.exit(f"gpu_study.sh: {d}/log.jsonl has no validation at step {steps}")
if max(steps_l) != int(steps): sys.exit(f"gpu_study.sh: {d} ended at step {max(steps_l)}, not {steps}")
last = [steps_l[s]["loss"] for s in sorted(steps_l)[-50:]]
tps = sorted(steps_l[s]["tokens_per_s"] for s in steps_l if s > 1) or [steps_l[1]["tokens_per_s"]]
m = re.search(r"GPU memory: peak ([0-9.]+) GiB", open(d + ".log").read())
cells = [cfg, v, seed, steps, batch, steps_l[int(steps)]["tokens"], device, precision, gpu, f"{val['val_loss']:.6f}",
         val["val_tokens"], f"{sum(last) / len(last):.6f}", f"{tps[len(tps) // 2]:.0f}", m.group(1) if m else "",
         wall, commit]
print(",".join(str(c) for c in cells))
PY
) || return 1
  echo "$row" >> "$STUDY"
  echo "  $name: $wall s, row: $row"
}

echo "gpu_study.sh: $(date -u '+%F %T') UTC, $CFG, $STEPS steps of $BATCH sequences, seeds $SEEDS, variants $VARIANTS," \
     "on $DEVICE ($PRECISION), budget $BUDGET s"
status=0
for seed in ${SEEDS//,/ }; do
  for v in $VARIANTS; do
    if [ "$DRY" = 0 ] && has_row "$v" "$seed"; then echo "  ${v}_s$seed: in $CSV, skipped"; continue; fi
    run_one "$v" "$seed" || status=1
  done
done
[ "$DRY" = 1 ] && exit 0
"$PY" bench/gpu_study_report.py "$STUDY" > "$OUT/study.md" || status=1
cat "$OUT/study.md"
# The picture: held-out loss per seed, a series a variant (this study's config, steps and device).
if [ "$(wc -l < "$STUDY")" -gt 1 ]; then
  "$JTOK" plot-csv --csv "$STUDY" --x seed --y val_loss --group variant --where "config=$CFG" --where "steps=$STEPS" \
    --where "device=$DEVICE" --no-line --title "held-out loss per seed: $CFG, $STEPS steps of $BATCH x T, $DEVICE $PRECISION" \
    --out "$OUT/study.svg" > /dev/null || status=1
fi
exit $status
