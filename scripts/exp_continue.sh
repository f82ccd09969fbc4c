#!/usr/bin/env bash
# Continued pretraining with tables attached: trains a base on configs/exp_jtok.json's backbone
# (no JTok, BASE_STEPS steps, seed s), then continues that same base CONT_STEPS more steps three ways
# (`train --init-from`, a fresh optimizer and schedule, seed 100 + s for all three, so the three share
# data order and fresh-table init):
#   cont       as it is, nothing attached
#   cont_jtok  +JTok attached with s = 0 (the model starts as the base exactly), every parameter trains
#   cont_tabl  +JTok attached with s = 0, `--train-only tables` (backbone frozen)
# With --constant-lr, two more arms that continue at the base's final learning rate (min_lr 2e-4,
# constant, no warmup), so the tables' effect is seen without the re-warmup the three above take:
#   cont_c       as cont, at the constant lr
#   cont_jtok_c  as cont_jtok, at the constant lr
# Every finished run appends its row to docs/data/continue_jtok.csv (scripts/study_lib.sh: held-out
# loss on the first VAL_BATCHES validation batches, the same for every run; median training
# tokens/s; the checkpoint it started from); rows present are skipped, so a stopped study continues.
# Then prints the paired gaps across seeds (cont_jtok - cont, cont_tabl - cont, cont_jtok_c - cont_c;
# scripts/exp_continue_report.py).
# The continuations also log the validation loss on the first 16 batches every 50 steps (the same
# batches for the three arms: a paired look before the end) and checkpoint every 50 steps.
#   scripts/exp_continue.sh [--seeds 1,2,3] [--base-steps 400] [--cont-steps 200] [--val-batches 64]
#                           [--parallel-arms] [--csv docs/data/continue_jtok.csv] [--out runs/exp_continue]
#                           [--constant-lr] [--report-only]
# One run at a time, or with --parallel-arms the three continuations of a seed at once (three
# processes: on a machine shared with other work each gets its own share); set OMP_NUM_THREADS (and
# nice) from outside.
main() {
  set -euo pipefail
  cd "$(dirname "$0")/.."
  local seeds=1,2,3 base_steps=400 cont_steps=200 val_batches=64 csv=docs/data/continue_jtok.csv
  local out=runs/exp_continue report_only=0 cfg=configs/exp_jtok.json par=0 constant=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --seeds) seeds=$2; shift 2 ;;
      --base-steps) base_steps=$2; shift 2 ;;
      --cont-steps) cont_steps=$2; shift 2 ;;
      --val-batches) val_batches=$2; shift 2 ;;
      --csv) csv=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      --report-only) report_only=1; shift ;;
      --parallel-arms) par=1; shift ;;
      --constant-lr) constant=1; shift ;;
      *) echo "usage: $0 [--seeds LIST] [--base-steps N] [--cont-steps N] [--val-batches N] [--parallel-arms] [--constant-lr] [--csv F] [--out DIR] [--report-only]" >&2; exit 2 ;;
    esac
  done
  STUDY_EXTRA_COLUMNS=tok_s,init_from
  STUDY_EVAL_ARGS="--val-batches $val_batches"
  . scripts/study_lib.sh
  if [ $report_only = 0 ]; then
    study_setup
    # Validation during training only at the end (the row's loss comes from `jtok eval`).
    local quiet=(--set eval_interval=100000 --set eval_batches=8 --set checkpoint_interval=100)
    local cont=(--set eval_interval=50 --set eval_batches=16 --set checkpoint_interval=50)
    local s base arm
    for s in ${seeds//,/ }; do
      base=$out/base_s${s}_n$base_steps
      study_run "$csv" continue "$cfg" base "$s" "$base_steps" 0 "$base" --jtok false "${quiet[@]}"
      local c=$((100 + s)) at=$out/from_s${s}_n$base_steps
      local arms=("cont --jtok false" "cont_jtok --jtok true" "cont_tabl --jtok true --train-only tables")
      local clr="--set learning_rate=2e-4 --set lr_scheduler_type=constant --set warmup_ratio=0"
      [ $constant = 1 ] && arms=("cont_c --jtok false $clr" "cont_jtok_c --jtok true $clr")
      for arm in "${arms[@]}"; do
        set -- $arm
        local name=$1; shift
        if [ $par = 1 ]; then
          study_run "$csv" continue "$cfg" "$name" "$c" "$cont_steps" 0 "$at/${name}_n$cont_steps" \
            --init-from "$base" "$@" "${cont[@]}" &
        else
          study_run "$csv" continue "$cfg" "$name" "$c" "$cont_steps" 0 "$at/${name}_n$cont_steps" \
            --init-from "$base" "$@" "${cont[@]}"
        fi
      done
      wait
    done
  fi
  PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
  "$PY" scripts/exp_continue_report.py "$csv" --runs "$out"
}
# The whole script is read before it runs (main at the end), so editing this file while the study
# runs does not change the running study.
main "$@"; exit
