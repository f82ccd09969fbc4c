#!/usr/bin/env bash
# Ablations on real text (issue 15, item 4):
# - norm: JTok without the L2 norm of the table rows (the paper's Appendix E.2): variant jtok_nonorm
#   (--jtok true, jtok_norm false) on configs/exp_jtok.json at 200 steps. Its baselines are the
#   seeds study's `base` and `jtok` rows of the same config, seed and steps (docs/data/seeds.csv),
#   reused, not rerun.
# - lambda: JTok-M's load-balancing coefficient (Appendix D) on configs/exp_moe.json at 250 steps:
#   variants jtokm_lambda<L> for L in --lambdas (default 1e-3,1e-2).
# - depth (only with --only depth): JTok-M without the 1/sqrt(2 N_layers) factor (Appendix E.1),
#   variant jtokm_noscale (--jtokm_depth_scaling false) on the lambda config at its steps, beside the
#   seeds study's `jtokm` row of the same seed; --seeds defaults to 1,2,3. lambda 1e-4 (the config's
#   default) is the seeds study's `jtokm` row, reused; that row has no load fractions (give
#   --lambdas 1e-4,1e-3,1e-2 to train it here too, with them).
# Every finished run appends its row to docs/data/ablations.csv (scripts/study_lib.sh: rows already
# there are skipped, so rerunning continues a stopped study): the seeds-study columns plus knob,
# knob_value, jtokm_aux, load, load_min (the load fractions per table over the last 50 steps; see
# study_lib.sh). Then prints the tables, from the CSVs alone (scripts/study_ablate_report.py).
#   scripts/study_ablate.sh [--seeds LIST] [--only norm|lambda|depth] [--lambdas 1e-3,1e-2]
#                           [--norm-steps 200] [--lambda-steps 250] [--csv docs/data/ablations.csv]
#                           [--baseline-csv docs/data/seeds.csv] [--out runs/study_ablate]
#                           [--norm-config C] [--lambda-config C] [--workdir DIR] [--report-only]
# --seeds defaults to 1,2,3 for norm and 1 for lambda. --workdir runs from DIR instead of the
# repository root (the test: a tiny config and corpus). One process, one run at a time; set
# OMP_NUM_THREADS (and nice) from outside.
main() {
  set -euo pipefail
  local root; root=$(cd "$(dirname "$0")/.." && pwd)
  . "$root/scripts/study_lib.sh"
  local seeds="" only="" lambdas=1e-3,1e-2 norm_steps=200 lambda_steps=250 csv=docs/data/ablations.csv
  local base_csv=docs/data/seeds.csv out=runs/study_ablate norm_cfg=configs/exp_jtok.json lambda_cfg=configs/exp_moe.json
  local workdir=$root report_only=0 blimp=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --seeds) seeds=$2; shift 2 ;;
      --only) only=$2; shift 2 ;;
      --lambdas) lambdas=$2; shift 2 ;;
      --norm-steps) norm_steps=$2; shift 2 ;;
      --lambda-steps) lambda_steps=$2; shift 2 ;;
      --csv) csv=$2; shift 2 ;;
      --baseline-csv) base_csv=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      --norm-config) norm_cfg=$2; shift 2 ;;
      --lambda-config) lambda_cfg=$2; shift 2 ;;
      --workdir) workdir=$2; shift 2 ;;
      --report-only) report_only=1; shift ;;
      *) echo "usage: $0 [--seeds LIST] [--only norm|lambda|depth] [--lambdas LIST] [--norm-steps N] [--lambda-steps N] [--csv F] [--baseline-csv F] [--out DIR] [--norm-config C] [--lambda-config C] [--workdir DIR] [--report-only]" >&2; exit 2 ;;
    esac
  done
  case "$only" in ""|norm|lambda|depth) ;; *) echo "study_ablate: --only must be norm, lambda or depth, not '$only'" >&2; exit 2 ;; esac
  cd "$workdir"
  STUDY_EXTRA_COLUMNS=knob,knob_value,jtokm_aux,load,load_min
  if [ $report_only = 0 ]; then
    study_setup
    local s l
    if [ "$only" = depth ]; then
      for s in $(echo "${seeds:-1,2,3}" | tr , ' '); do
        STUDY_KNOB=jtokm_depth_scaling STUDY_KNOB_VALUE=false \
          study_run "$csv" ablate "$lambda_cfg" jtokm_noscale "$s" "$lambda_steps" "$blimp" \
          "$out/depth/jtokm_noscale_s${s}_n$lambda_steps" --jtok false --jtokm true --jtokm_depth_scaling false
      done
    fi
    if [ "$only" != lambda ] && [ "$only" != depth ]; then
      for s in $(echo "${seeds:-1,2,3}" | tr , ' '); do
        STUDY_KNOB=jtok_norm STUDY_KNOB_VALUE=false \
          study_run "$csv" ablate "$norm_cfg" jtok_nonorm "$s" "$norm_steps" "$blimp" "$out/norm/jtok_nonorm_s${s}_n$norm_steps" \
          --jtok true --jtok_norm false
      done
    fi
    if [ "$only" != norm ] && [ "$only" != depth ]; then
      for s in $(echo "${seeds:-1}" | tr , ' '); do
        for l in $(echo "$lambdas" | tr , ' '); do
          STUDY_KNOB=jtokm_aux_loss_coef STUDY_KNOB_VALUE=$l \
            study_run "$csv" ablate "$lambda_cfg" "jtokm_lambda$l" "$s" "$lambda_steps" "$blimp" \
            "$out/lambda/jtokm_lambda${l}_s${s}_n$lambda_steps" --jtok false --jtokm true --jtokm_aux_loss_coef "$l"
        done
      done
    fi
  fi
  PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
  "$PY" "$root/scripts/study_ablate_report.py" "$csv" --baseline "$base_csv"
}
# The whole script is read before it runs (main at the end), so editing or checking out this file
# while a long study runs does not change the running study.
main "$@"; exit
