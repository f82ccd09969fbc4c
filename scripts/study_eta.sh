#!/usr/bin/env bash
# The eta sweep (issue 15, item 3; the paper's Figure 7b): JTok-M on one fixed MoE backbone
# (configs/exp_moe.json) at rho = K / n_e = 0.25 with n_e = 4, 8, 12, 16 (K = 1, 2, 3, 4), tables on
# one layer (jtokm_layers, default 1) so that the largest stays within memory. The MoE without
# tables at the same seed and steps is the seeds study's row (docs/data/seeds.csv; --with-moe runs
# it here too). Each finished run appends its row to docs/data/eta.csv (scripts/study_lib.sh: rows
# already there are skipped). Then fits the validation loss against log2(eta) and draws
# docs/figures/eta.svg, both from the CSVs alone (scripts/study_eta_report.py).
#   scripts/study_eta.sh [--n-e 4,8,12,16] [--layers 1] [--steps 150] [--seeds 1] [--with-moe]
#                        [--csv docs/data/eta.csv] [--out runs/study_eta] [--report-only]
# One process, one run at a time; set OMP_NUM_THREADS (and nice) from outside.
main() {
  set -euo pipefail
  cd "$(dirname "$0")/.."
  . scripts/study_lib.sh
  local n_es=4,8,12,16 layers=1 steps=150 seeds=1 csv=docs/data/eta.csv out=runs/study_eta report_only=0 with_moe=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --n-e) n_es=$2; shift 2 ;;
      --layers) layers=$2; shift 2 ;;
      --steps) steps=$2; shift 2 ;;
      --seeds) seeds=$2; shift 2 ;;
      --csv) csv=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      --with-moe) with_moe=1; shift ;;
      --report-only) report_only=1; shift ;;
      *) echo "usage: $0 [--n-e LIST] [--layers L] [--steps N] [--seeds LIST] [--with-moe] [--csv F] [--out DIR] [--report-only]" >&2; exit 2 ;;
    esac
  done
  if [ $report_only = 0 ]; then
    study_setup
    local s ne k
    for s in ${seeds//,/ }; do
      [ $with_moe = 1 ] && study_run "$csv" eta configs/exp_moe.json moe "$s" "$steps" 0 "$out/moe_s${s}_n$steps" --jtok false --jtokm false
      for ne in ${n_es//,/ }; do
        [ $((ne % 4)) = 0 ] || { echo "study_eta: n_e $ne is not a multiple of 4 (rho = 0.25 needs K = n_e / 4)" >&2; exit 2; }
        k=$((ne / 4))
        study_run "$csv" eta configs/exp_moe.json "jtokm_ne${ne}_k${k}_l${layers//,/+}" "$s" "$steps" 0 \
          "$out/jtokm_ne${ne}_l${layers//,/+}_s${s}_n$steps" --jtok false --jtokm true \
          --jtokm_n_e "$ne" --jtokm_top_k "$k" --jtokm_layers "$layers"
      done
    done
  fi
  PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
  "$PY" scripts/study_eta_report.py "$csv" --baseline docs/data/seeds.csv
  local jt=${JTOK_BIN:-build/jtok}
  if [ -x "$jt" ]; then
    mkdir -p docs/figures
    "$jt" plot-csv --csv "$csv" --x eta --y val_loss --where variant!=moe --log-x --group steps \
      --title "JTok-M at rho 0.25: validation loss vs eta (series: steps)" --out docs/figures/eta.svg
  fi
}
# Read whole before it runs, so editing this file while a long study runs changes nothing.
main "$@"; exit
