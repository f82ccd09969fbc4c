#!/usr/bin/env bash
# Issue 39's loss curve on a GPU host: config b (configs/bench_b.json: d 768, 12 layers, vocab 50304)
# + JTok-M on every layer (n_e 5, K 2), 16 x 1024 tokens a step, STEPS steps of the real corpus,
# three runs from the same initial weights and the same batches:
#   ours_gpu_bf16     jtok parity --device cuda, precision bf16 (bf16 copies of fp32 masters)
#   pytorch_gpu_bf16  the PyTorch reference (tests/reference/model.py) on the same GPU after it:
#                     bf16 autocast, SDPA, fused AdamW, jtok's hyperparameters, clipping, lr schedule
#   ours_cpu_fp32     jtok parity --device cpu, fp32, its first CPU_STEPS steps, on the host's CPU
#                     cores beside the PyTorch run (not beside ours: the two jtok processes hold
#                     the 10 GB of weights, moments and outputs each, too much host memory at once)
#   bash bench/gpu_loss_curve.sh --jtok BIN --data SHARDS --out DIR [--steps 300] [--cpu-steps 5]
#        [--device cuda|cpu] [--config configs/bench_b.json] [--batch 16] [--budget 480]
#        [--work DIR] [--dry-run]
# --data: token shards, read as the loader's sequential stream of windows of 1025 tokens, wrapping
# after the last as jtok's loader does (the gpt2 training split holds 4,746 windows, 296.6 steps: at
# --steps 300 steps 297-300 read its start again; the summary's "stream:" line says where).
# bench/gpu_loss_curve.py writes the run's config, the reference's seeded init as jtok's float32
# safetensors and the batches (int32 (STEPS, 1, 16, 1024)) into a temp dir under --work (default
# $TMPDIR or /tmp), deleted at the end: config b + JTok-M is 2.51 G weights, 10.0 GB; the parity
# runs write their per-step series only (`jtok parity --series-only`: loss, aux, grad_norm, lr),
# so ~10 GB in all (the script checks the free space first).
# In DIR: curve.csv (step, ours_gpu_bf16, pytorch_gpu_bf16, ours_cpu_fp32; empty cells where a run
# has no step), curve_long.csv + curve.svg (`jtok plot-csv`), summary.txt (status, wall seconds,
# loss at step 1 / last / mean of the last 50 steps a run; max |diff|, its step and the max relative
# diff a pair of runs over their common steps; the lr schedules' difference) and summary.json (one
# line), runs.tsv, one log and one series file a run.
# Time boxes (each cut to what is left of --budget, default 480 s, so the report always comes out):
# prepare 150 s, ours 210 s, pytorch 180 s; the CPU run whatever is left when it starts less 20 s.
# A killed or failed run leaves its column empty and the script's status 1.
# Time on an H200 (an estimate, not measured yet): prepare ~1 min (2.51 G weights drawn on the GPU,
# 10 GB written); ours ~1-3 min (10 GB read, 300 steps); pytorch ~1-1.5 min (issue 39's eager JTok-M rate, 0.571 x 229,155 tokens/s, is ~0.13 s a
# step); the CPU run beside it ~3-4 min (issue 39's 909 tokens/s dense on 16 cores is ~18 s a step
# before JTok-M). About 6-8 min in all; the CPU run is the one the box may cut.
# --device cpu with a tiny --config checks it all without a GPU: the reference on the CPU under bf16
# autocast and `jtok parity --device loopback` (fp32) standing in for the GPU run
# (tests/test_gpu_loss_curve.sh). --dry-run prints the commands and runs nothing.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
JTOK=""; DATA=""; OUT=""; STEPS=300; CPU_STEPS=5; DEVICE=cuda; CONFIG=configs/bench_b.json; BATCH=16
BUDGET=480; WORK_PARENT=${TMPDIR:-/tmp}; DRY=0; PY=${PYTHON:-python3}
usage="usage: $0 --jtok BIN --data SHARDS --out DIR [--steps N] [--cpu-steps N] [--device cuda|cpu] [--config F] [--batch B] [--budget S] [--work DIR] [--dry-run]"
while [ $# -gt 0 ]; do
  case "$1" in
    --jtok) JTOK=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --cpu-steps) CPU_STEPS=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --work) WORK_PARENT=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
[ -n "$JTOK" ] && [ -n "$DATA" ] && [ -n "$OUT" ] || { echo "$usage" >&2; exit 2; }
case "$DEVICE" in cuda) OURS_DEVICE=cuda ;; cpu) OURS_DEVICE=loopback ;; *) echo "$usage" >&2; exit 2 ;; esac
[ "$DRY" = 1 ] || [ -e "$DATA" ] || { echo "gpu_loss_curve.sh: no token shards at $DATA" >&2; exit 2; }
[ "$DRY" = 1 ] || [ -x "$JTOK" ] || { echo "gpu_loss_curve.sh: no jtok binary at $JTOK" >&2; exit 2; }
mkdir -p "$OUT" && : > "$OUT/runs.tsv"
if [ "$DRY" = 1 ]; then W="$WORK_PARENT/gpu_loss_curve.XXXXXX"; else
  W=$(mktemp -d "$WORK_PARENT/gpu_loss_curve.XXXXXX") || exit 1
  trap 'rm -rf "$W"' EXIT
  trap 'exit 143' TERM INT   # the EXIT trap removes the 10 GB files when a box kills the script
fi
# Threads: ours alone has every core (step 0's logits are computed on the host); then the CPU run
# all but two, the PyTorch run beside it two (it only launches GPU work).
CORES=$(nproc); OURS_THREADS=${OMP_NUM_THREADS:-$CORES}; CPU_THREADS=${OMP_NUM_THREADS:-$((CORES > 4 ? CORES - 2 : 2))}
PT_THREADS=${OMP_NUM_THREADS:-2}

limit_of() {  # limit_of BOX: BOX cut to what is left of the budget
  local left=$((BUDGET - SECONDS))
  echo $((left < $1 ? left : $1))
}
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$OUT/runs.tsv"; }
run() {  # run NAME LIMIT CMD...: output to OUT/NAME.log, killed after LIMIT s, recorded in runs.tsv
  local name=$1 limit=$2; shift 2
  echo "+ timeout $limit $* > $OUT/$name.log"
  [ "$DRY" = 1 ] && return 0
  if [ "$limit" -lt 10 ]; then echo "  $name: SKIPPED (the --budget of $BUDGET s is spent)"; record "$name" skipped 0; return 1; fi
  local t0=$SECONDS rc=0 status=ok
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || rc=$?
  case $rc in 0) ;; 124) status="KILLED after $limit s" ;; *) status="FAILED rc $rc" ;; esac
  record "$name" "$status" $((SECONDS - t0))
  echo "  $name: $status ($((SECONDS - t0)) s)"; [ $rc = 0 ] || tail -n 3 "$OUT/$name.log"
  return $rc
}
parity() {  # parity NAME DEVICE CONFIG STEPS THREADS LIMIT: one jtok parity run, its series kept
  local name=$1 dev=$2 cfg=$3 steps=$4 threads=$5 limit=$6 rc=0
  run "$name" "$limit" env OMP_NUM_THREADS="$threads" "$JTOK" parity --config "$W/$cfg" \
    --weights "$W/weights.safetensors" --batch "$W/batch.safetensors" --steps "$steps" --device "$dev" \
    --series-only --out "$W/$name.safetensors" || rc=$?
  [ "$DRY" = 1 ] && return 0
  if [ $rc = 0 ]; then "$PY" bench/gpu_loss_curve_report.py series "$W/$name.safetensors" "$OUT/$name.json" || rc=1; fi
  rm -f "$W/$name.safetensors"
  return $rc
}

status=0
FS=$(df --output=fstype "$WORK_PARENT" 2>/dev/null | tail -n 1)
echo "gpu_loss_curve.sh: $(date -u '+%F %T') UTC, $STEPS steps on $DEVICE ($CPU_STEPS on the CPU), work dir $W" \
     "(${FS:-?}, $(df -h --output=avail "$WORK_PARENT" 2>/dev/null | tail -n 1 | xargs) free)"
[ "$FS" = tmpfs ] && echo "gpu_loss_curve.sh: note: $WORK_PARENT is a tmpfs: the big files take host memory (--work DIR on a disk)"
run prepare "$(limit_of 150)" "$PY" bench/gpu_loss_curve.py prepare --base "$CONFIG" --data "$DATA" --steps "$STEPS" \
  --batch "$BATCH" --cpu-steps "$CPU_STEPS" --device "$DEVICE" --work "$W" || { cat "$OUT/prepare.log"; exit 1; }
[ "$DRY" = 1 ] || cat "$OUT/prepare.log"
parity ours_device "$OURS_DEVICE" config_device.json "$STEPS" "$OURS_THREADS" "$(limit_of 210)" || status=1
CPU_PID=""
if [ "$CPU_STEPS" -gt 0 ]; then
  parity ours_cpu cpu config_cpu.json "$CPU_STEPS" "$CPU_THREADS" $((BUDGET - SECONDS - 20)) &
  CPU_PID=$!
  [ "$DRY" = 1 ] && wait "$CPU_PID"   # its command printed before the next one
fi
run pytorch "$(limit_of 180)" env OMP_NUM_THREADS="$PT_THREADS" "$PY" bench/gpu_loss_curve.py train --work "$W" \
  --device "$DEVICE" --out "$OUT/pytorch.jsonl" || status=1
if [ -n "$CPU_PID" ]; then wait "$CPU_PID" || status=1; fi

echo "+ $PY bench/gpu_loss_curve_report.py report $OUT $DEVICE"
echo "+ $JTOK plot-csv --csv $OUT/curve_long.csv --x step --y loss --group run --out $OUT/curve.svg"
[ "$DRY" = 1 ] && exit 0
"$PY" bench/gpu_loss_curve_report.py report "$OUT" "$DEVICE" || status=1
if [ "$(wc -l < "$OUT/curve_long.csv")" -gt 1 ]; then
  "$JTOK" plot-csv --csv "$OUT/curve_long.csv" --x step --y loss --group run --out "$OUT/curve.svg" \
    --title "$(basename "$CONFIG" .json) + JTok-M (n_e 5, K 2), $BATCH sequences a step: training loss" \
    --y-label "training loss" || status=1
fi
exit $status
