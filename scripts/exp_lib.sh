# shellcheck shell=bash disable=SC2034  # sourced: its variables are the sourcing script's
# Shared by the experiment scripts (sourced from the repository root).

# JTOK (built if missing), the prepared corpus, OpenMP's PASSIVE wait policy unless set.
exp_setup() {
  JTOK=${JTOK_BIN:-build/jtok}
  [ -x "$JTOK" ] || { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null && cmake --build build -j2; }
  [ -n "$(ls data/train/*.bin 2>/dev/null)" ] || bash scripts/prepare_data.sh
  export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
}

# The options of the train-and-evaluate experiments (exp_jtok.sh, exp_moe.sh): sets STEPS,
# CONFIG, OUT, BLIMP_LIMIT, EXTRA; CONFIG and OUT keep the caller's defaults unless given.
exp_parse_args() {
  STEPS=""; BLIMP_LIMIT=0; EXTRA=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --steps) STEPS=$2; shift 2 ;;
      --config) CONFIG=$2; shift 2 ;;
      --out) OUT=$2; shift 2 ;;
      --blimp-limit) BLIMP_LIMIT=$2; shift 2 ;;
      --extra) EXTRA=$2; shift 2 ;;
      *) echo "usage: $0 [--steps N] [--config C] [--out DIR] [--blimp-limit N] [--extra ARGS]" >&2; exit 2 ;;
    esac
  done
}

# exp_train_eval DIR TRAIN_FLAGS...: trains CONFIG into DIR (resuming a checkpoint there) and writes
# DIR/eval.json; a variant with eval.json is done and skipped.
exp_train_eval() {
  local dir=$1; shift
  if [ -f "$dir/eval.json" ]; then echo "$(basename "$0" .sh): $(basename "$dir") done, skipping"; return 0; fi
  local steps_arg=() resume=()
  [ -n "$STEPS" ] && steps_arg=(--max-steps "$STEPS")
  # A directory with checkpoints or a log holds this variant's earlier, stopped run: continue it
  # (`train` refuses a fresh run there; --resume without a complete checkpoint starts from scratch).
  { [ -d "$dir/checkpoints" ] || [ -f "$dir/log.jsonl" ]; } && resume=(--resume)
  # shellcheck disable=SC2086
  "$JTOK" train --config "$CONFIG" "$@" --out "$dir" "${steps_arg[@]}" "${resume[@]}" $EXTRA | tee "$dir.train.out"
  "$JTOK" eval --checkpoint "$dir" --json --blimp-limit "$BLIMP_LIMIT" > "$dir/eval.json.tmp"
  mv "$dir/eval.json.tmp" "$dir/eval.json"
}
