#!/usr/bin/env bash
# Issue 39's training bench on a GPU host: config b (configs/bench_b.json: d 768, 12 layers, vocab
# 50304, T 1024) with 16 x 1024 tokens a step, the PyTorch peer (tests/reference/train_bench.py:
# bf16 autocast, SDPA attention, fused AdamW; eager, then torch.compile) on dense / +JTok / +JTok-M
# (n_e 5, K 2, every layer), each one process with one JSON line (tokens/s, MFU, peak memory); then
# ours (`jtok bench-train --device cuda --set precision=bf16`: bf16 copies of fp32 masters, fp32
# accumulation, JTOK_PROFILE=1: each step's phases timed by device events; one process a model:
# dense, +JTok, +JTok-M, JTok-M with table_streams true (the table AdamW and row syncs on side
# streams), JTok-M with table_optimizer dense-eager (the table AdamW's naive pass over every row
# every step), and jtokm_naive: that and table_dedup false, a token-table row gathered and
# scattered a position at a time); then
# bench/gpu_train_peer_table.py's tables: ratios JTok/dense and JTok-M/dense per engine and mode,
# ours/compile, and ours as the paper's training table in kind (backbone, +JTok-M without dedup,
# +dedup, +the deferred table optimizer, +side streams). table_dedup false and table_streams are
# --device cuda only: with --device cpu jtokm_naive and jtokm_streams are skipped (rows of "-").
#   bash bench/gpu_train_peer.sh --data DIR [--jtok BIN] [--out DIR] [--steps N] [--warmup N]
#        [--modes "eager compile"] [--models "dense jtok jtokm"] [--timeout S] [--budget S] [--dry-run]
#        [--config FILE] [--batch B] [--device cuda|cpu] [--kernel-trace]
# --data: token shards (scripts/gpu_prepare.sh carries the first 40 steps' worth); --out: logs and
# JSON lines (default bench-out/gpu_train_peer); defaults 10 timed steps after 3 warm-up steps (the
# first compiles), each run killed after --timeout seconds (default 150; a killed run is reported
# and the rest go on); --budget S (default 330): no run starts after S seconds of the script, and a
# run's limit is cut to what is left, so the table always comes out. --dry-run prints the
# commands and runs nothing. Ours runs first, then the peer's runs the goals compare with
# (torch.compile dense and JTok-M, then eager), so a spent budget cuts the least needed.
# --config / --batch (default configs/bench_b.json, 16) and --device cpu (bf16 autocast without the
# fused AdamW) are for checking this script on a small config without a GPU (tests/test_gpu_scripts.sh).
# --kernel-trace: each run's timed steps traced kernel by kernel (ours: JTOK_KERNEL_TRACE, the peer:
# --kernel-trace, torch.profiler; OUT/<run>.csv), ours' variants (streams, eager, naive) left out,
# then bench/gpu_kernels_report.py's tables of where each step's device time goes (OUT/kernels.md).
# Time on an H100/H200 (estimate): ~15-20 s a run in eager (start-up, table init, 13 steps), 40-90 s
# with compile (inductor), ~4-5 min in all.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
DATA=""; JTOK=""; OUT=bench-out/gpu_train_peer; STEPS=10; WARMUP=3; MODES="eager compile"
MODELS="dense jtok jtokm"; LIMIT=150; BUDGET=330; DRY=0; TRACE=0
CONFIG=configs/bench_b.json; BATCH=16; DEVICE=cuda; PY=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --data) DATA=$2; shift 2 ;;
    --jtok) JTOK=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --timeout) LIMIT=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --kernel-trace) TRACE=1; shift ;;
    *) echo "usage: $0 --data DIR [--jtok BIN] [--out DIR] [--steps N] [--warmup N] [--modes M] [--models M] [--timeout S] [--budget S] [--dry-run] [--config F] [--batch B] [--device D] [--kernel-trace]" >&2; exit 2 ;;
  esac
done
[ -n "$DATA" ] || { echo "gpu_train_peer.sh: --data DIR is required (token shards; scripts/gpu_prepare.sh packs some)" >&2; exit 2; }
[ "$DRY" = 1 ] || [ -d "$DATA" ] || [ -f "$DATA" ] || { echo "gpu_train_peer.sh: no token shards at $DATA" >&2; exit 2; }
mkdir -p "$OUT"
BASE=(--config "$CONFIG" --set "micro_batch_size=$BATCH" --data "$DATA" --steps "$STEPS" --warmup "$WARMUP")
JTOKM_SETS=(--set jtokm_n_e=5 --set jtokm_top_k=2)

run() {  # run NAME CMD...: stdout -> OUT/NAME.json, stderr -> OUT/NAME.log, killed after LIMIT s
  local name=$1; shift
  local limit=$LIMIT left=$((BUDGET - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  echo "+ timeout $limit $* > $OUT/$name.json"
  [ "$DRY" = 1 ] && return 0
  if [ "$limit" -lt 20 ]; then echo "  $name: SKIPPED (the --budget of $BUDGET s is spent)"; return 1; fi
  local t0=$SECONDS rc=0
  timeout "$limit" "$@" > "$OUT/$name.json" 2> "$OUT/$name.log" || rc=$?
  if [ $rc = 0 ]; then echo "  $name: $((SECONDS - t0)) s"
  elif [ $rc = 124 ]; then echo "  $name: KILLED after $limit s (tail of $OUT/$name.log:)"; tail -n 3 "$OUT/$name.log"
  else echo "  $name: FAILED rc $rc after $((SECONDS - t0)) s:"; tail -n 2 "$OUT/$name.log"; fi
  return $rc
}

status=0
# Ours: one process a model (on a GPU the models need not share one: each gets the device and its
# memory to itself), bf16; then JTok-M with the table AdamW's naive pass (table_optimizer
# dense-eager), the cost the deferred optimizer saves, and that without dedup (table_dedup false),
# the cost dedup saves.
ours_sets() {  # ours_sets MODEL: the bench-train overrides of one of ours
  case "$1" in
    dense) ;;
    jtok) echo "--set jtok=true" ;;
    jtokm) echo "--set jtokm=true ${JTOKM_SETS[*]}" ;;
    jtokm_streams) echo "--set jtokm=true ${JTOKM_SETS[*]} --set table_streams=true" ;;
    jtokm_eager) echo "--set jtokm=true ${JTOKM_SETS[*]} --set table_optimizer=dense-eager" ;;
    jtokm_naive) echo "--set jtokm=true ${JTOKM_SETS[*]} --set table_optimizer=dense-eager --set table_dedup=false" ;;
  esac
}
peer_flags() {  # peer_flags MODE MODEL: train_bench.py's options of one of the peer's runs
  local f="--device $DEVICE --amp bf16 --threads 8"
  [ "$DEVICE" = cuda ] && f+=" --fused-adamw"
  [ "$1" = compile ] && f+=" --compile"
  case "$2" in
    dense) ;;
    jtok) f+=" --jtok" ;;
    jtokm) f+=" --jtokm ${JTOKM_SETS[*]}" ;;
    *) echo "gpu_train_peer.sh: unknown model $2 (dense, jtok, jtokm)" >&2; exit 2 ;;
  esac
  echo "$f"
}
wanted() { [[ " $MODELS " == *" $1 "* ]]; }
if [ -n "$JTOK" ]; then
  for model in dense jtokm jtokm_streams jtok jtokm_eager jtokm_naive; do
    wanted "${model%%_*}" || continue
    [ "$TRACE" = 1 ] && [ "$model" != "${model%%_*}" ] && continue  # traced: the models, not the variants
    if [ "$model" = jtokm_naive ] && [ "$DEVICE" != cuda ]; then
      echo "  ours_jtokm_naive: skipped (table_dedup false is --device cuda only)"
      continue
    fi
    if [ "$model" = jtokm_streams ] && [ "$DEVICE" != cuda ]; then
      echo "  ours_jtokm_streams: skipped (table_streams is --device cuda only: the CPU has no streams)"
      continue
    fi
    trace=(); [ "$TRACE" = 1 ] && trace=("JTOK_KERNEL_TRACE=$OUT/ours_$model.csv")
    # shellcheck disable=SC2046  # the overrides are words
    run "ours_$model" env JTOK_PROFILE=1 "${trace[@]}" "$JTOK" bench-train "${BASE[@]}" --device "$DEVICE" \
      --set precision=bf16 $(ours_sets "$model") ||
      status=1
  done
else
  echo "ours: no --jtok binary given: the peer alone"
fi
# The peer, the runs the goals compare with first (a spent --budget skips the last ones).
for run_name in compile:dense compile:jtokm eager:dense eager:jtokm compile:jtok eager:jtok; do
  mode=${run_name%%:*} model=${run_name#*:}
  [[ " $MODES " == *" $mode "* ]] && wanted "$model" || continue
  trace=(); [ "$TRACE" = 1 ] && trace=(--kernel-trace "$OUT/peer_${mode}_${model}.csv")
  # shellcheck disable=SC2046  # the options are words
  run "peer_${mode}_${model}" "$PY" tests/reference/train_bench.py "${BASE[@]}" $(peer_flags "$mode" "$model") \
    "${trace[@]}" || status=1
done

[ "$DRY" = 1 ] && exit 0
T_SEQ=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("seq_len", "?"))' "$CONFIG" 2>/dev/null || echo "?")
"$PY" bench/gpu_train_peer_table.py "$OUT" "$(basename "$CONFIG" .json), $BATCH x $T_SEQ tokens a step" | tee "$OUT/table.md"
if [ "$TRACE" = 1 ]; then
  if compgen -G "$OUT/*.csv" > /dev/null; then
    "$PY" bench/gpu_kernels_report.py "$OUT" "$(basename "$CONFIG" .json), $BATCH x $T_SEQ tokens a step" > "$OUT/kernels.md" ||
      status=1
    head -n 20 "$OUT/kernels.md"
  else
    echo "gpu_train_peer.sh: --kernel-trace: no run wrote a trace (their JSON lines' kernel_trace say why)"; status=1
  fi
fi
exit $status
