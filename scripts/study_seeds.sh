#!/usr/bin/env bash
# Seeds study (issue 15, item 2): baseline vs +JTok on configs/exp_jtok.json and MoE vs +JTok-M on
# configs/exp_moe.json, at several seeds (the seed sets the initialisation and the data order); a
# pair shares seed, steps and tokens. Every finished run appends its row to docs/data/seeds.csv
# (scripts/study_lib.sh: rows already there are skipped, so rerunning continues a stopped study).
# Then prints the paired gaps with mean, sd and a paired t-test and draws docs/figures/seeds_{dense,moe}_nSTEPS.svg (one per step count),
# both from the CSV alone (scripts/study_seeds_report.py).
#   scripts/study_seeds.sh [--seeds 1,2,3] [--dense-steps 200] [--moe-steps 250] [--only dense|moe]
#                          [--csv docs/data/seeds.csv] [--out runs/study_seeds] [--blimp-limit 0] [--report-only]
# One process, one run at a time; set OMP_NUM_THREADS (and nice) from outside.
main() {
  set -euo pipefail
  cd "$(dirname "$0")/.."
  . scripts/study_lib.sh
  local seeds=1,2,3 dense_steps=200 moe_steps=250 only="" csv=docs/data/seeds.csv out=runs/study_seeds blimp=0 report_only=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --seeds) seeds=$2; shift 2 ;;
      --dense-steps) dense_steps=$2; shift 2 ;;
      --moe-steps) moe_steps=$2; shift 2 ;;
      --only) only=$2; shift 2 ;;
      --csv) csv=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      --blimp-limit) blimp=$2; shift 2 ;;
      --report-only) report_only=1; shift ;;
      *) echo "usage: $0 [--seeds LIST] [--dense-steps N] [--moe-steps N] [--only dense|moe] [--csv F] [--out DIR] [--blimp-limit N] [--report-only]" >&2; exit 2 ;;
    esac
  done
  if [ $report_only = 0 ]; then
    study_setup
    local s
    for s in ${seeds//,/ }; do
      if [ "$only" != moe ]; then
        study_run "$csv" seeds configs/exp_jtok.json base "$s" "$dense_steps" "$blimp" "$out/dense/base_s${s}_n$dense_steps" --jtok false
        study_run "$csv" seeds configs/exp_jtok.json jtok "$s" "$dense_steps" "$blimp" "$out/dense/jtok_s${s}_n$dense_steps" --jtok true
      fi
      if [ "$only" != dense ]; then
        study_run "$csv" seeds configs/exp_moe.json moe "$s" "$moe_steps" "$blimp" "$out/moe/moe_s${s}_n$moe_steps" --jtok false --jtokm false
        study_run "$csv" seeds configs/exp_moe.json jtokm "$s" "$moe_steps" "$blimp" "$out/moe/jtokm_s${s}_n$moe_steps" --jtok false --jtokm true
      fi
    done
  fi
  PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
  "$PY" scripts/study_seeds_report.py "$csv"
  # The picture, from the CSV alone (build/jtok, or JTOK_BIN, read when the study ends).
  local jt=${JTOK_BIN:-build/jtok}
  mkdir -p docs/figures
  "$jt" plot-csv --csv "$csv" --x seed --y val_loss --group variant --where config=configs/exp_jtok.json \
    --where steps="$dense_steps" --title "validation loss per seed: baseline vs +JTok (exp_jtok, $dense_steps steps)" --out "docs/figures/seeds_dense_n$dense_steps.svg" || true
  "$jt" plot-csv --csv "$csv" --x seed --y val_loss --group variant --where config=configs/exp_moe.json \
    --where steps="$moe_steps" --title "validation loss per seed: MoE vs +JTok-M (exp_moe, $moe_steps steps)" --out "docs/figures/seeds_moe_n$moe_steps.svg" || true
}
# The whole script is read before it runs (main at the end), so editing or checking out this file
# while a long study runs does not change the running study.
main "$@"; exit
