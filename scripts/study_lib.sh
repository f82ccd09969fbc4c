# Shared by the study scripts (study_seeds.sh, study_eta.sh; sourced from the repository root).
#
# A study is a list of training runs. Each finished run appends one row to a CSV under docs/data/
# (committed), written atomically (temp file, fsync, rename) under a lock. A row's key is
# (study, config, variant, seed, steps): a run whose key is already in the CSV is skipped, so a
# study that was stopped continues where it stopped, on this machine or on another one that has the
# committed CSV. A run stopped mid-way resumes from its last checkpoint in its run directory when
# that is still there, else it starts again. Pictures are drawn from the CSVs alone.

STUDY_COLUMNS="study,config,variant,seed,steps,tokens,n_c,n_n,eta,rho,flops_6nd,val_loss,val_tokens,blimp,wall_s,commit"

# study_setup: sets JTOK (a private copy of the binary, so that rebuilding the tree while a long
# study runs changes nothing under it), STUDY_COMMIT (the tree's commit; "+dirty" when src/, apps/
# or configs/ have changes), PY; OpenMP's PASSIVE wait policy unless set.
study_setup() {
  local src=${JTOK_BIN:-build/jtok}
  if [ ! -x "$src" ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null && cmake --build build -j2 --target jtok
    src=build/jtok
  fi
  [ -n "$(ls data/train/*.bin 2>/dev/null)" ] || bash scripts/prepare_data.sh
  STUDY_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  [ -z "$(git status --porcelain --untracked-files=no -- src apps configs 2>/dev/null)" ] || STUDY_COMMIT="$STUDY_COMMIT+dirty"
  mkdir -p runs/bin
  JTOK=runs/bin/jtok.$$
  cp "$src" "$JTOK"
  # shellcheck disable=SC2064
  trap "rm -f '$JTOK'" EXIT
  PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
  export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
}

# study_has_row CSV STUDY CONFIG VARIANT SEED STEPS: true when the CSV has a row with this key.
study_has_row() {
  local csv=$1 key="$2,$3,$4,$5,$6"
  [ -f "$csv" ] && cut -d, -f1-5 "$csv" | grep -qxF -- "$key"
}

# study_append CSV ROW: appends ROW (no newline) atomically, under a lock shared by every study
# process of this tree; creates the CSV with its header. Fails if the CSV has another header.
study_append() {
  local csv=$1 row=$2
  mkdir -p "$(dirname "$csv")" runs
  (
    flock 9
    if [ -f "$csv" ]; then
      local head; head=$(head -n 1 "$csv")
      [ "$head" = "$STUDY_COLUMNS" ] || { echo "study: $csv: header is '$head', expected '$STUDY_COLUMNS'" >&2; exit 1; }
      cp "$csv" "$csv.tmp"
    else
      echo "$STUDY_COLUMNS" > "$csv.tmp"
    fi
    echo "$row" >> "$csv.tmp"
    sync "$csv.tmp"
    mv "$csv.tmp" "$csv"
  ) 9> runs/.study.lock
}

# study_run CSV STUDY CONFIG VARIANT SEED STEPS BLIMP_LIMIT DIR [TRAIN ARGS...]: unless the CSV has
# the key, trains CONFIG with TRAIN ARGS for STEPS steps at SEED (init and data order) into DIR
# (continuing a stopped run there), evaluates it on the whole validation set (and BLiMP at
# BLIMP_LIMIT pairs per paradigm; 0 = no BLiMP) and appends its row. wall_s is the wall time of
# this call (training resumed from a checkpoint counts only the part after the resume).
study_run() {
  local csv=$1 study=$2 config=$3 variant=$4 seed=$5 steps=$6 blimp=$7 dir=$8
  shift 8
  case "$study$config$variant$seed$steps" in *,*) echo "study: fields must not contain commas" >&2; return 1 ;; esac
  if study_has_row "$csv" "$study" "$config" "$variant" "$seed" "$steps"; then
    echo "study: $study $variant seed $seed ($steps steps) is in $csv, skipping"
    return 0
  fi
  local t0; t0=$(date +%s)
  local resume=()
  { [ -d "$dir/checkpoints" ] || [ -f "$dir/log.jsonl" ]; } && resume=(--resume)
  mkdir -p "$(dirname "$dir")" || return 1
  echo "study: $study $variant seed $seed ($steps steps) -> $dir"
  "$JTOK" train --config "$config" "$@" --seed "$seed" --max-steps "$steps" --out "$dir" --peak-gflops 1 \
    "${resume[@]}" > "$dir.train.out" 2>&1 || { echo "study: training failed, see $dir.train.out" >&2; tail -n 5 "$dir.train.out" >&2; return 1; }
  local blimp_args=(--no-blimp)
  [ "$blimp" -gt 0 ] && blimp_args=(--blimp-limit "$blimp")
  "$JTOK" eval --checkpoint "$dir" --json "${blimp_args[@]}" > "$dir.eval.json.tmp" || { echo "study: eval of $dir failed" >&2; return 1; }
  mv "$dir.eval.json.tmp" "$dir.eval.json" || return 1
  local wall=$(( $(date +%s) - t0 )) row
  row=$("$PY" - "$dir" "$study" "$config" "$variant" "$seed" "$steps" "$wall" "$STUDY_COMMIT" <<'PY'
import json, sys
d, study, config, variant, seed, steps, wall, commit = sys.argv[1:]
e = json.load(open(d + ".eval.json"))
start, last = None, None
for line in open(d + "/log.jsonl"):
    j = json.loads(line)
    if j.get("type") == "start" and start is None: start = j
    if j.get("type") == "step": last = j
if start is None or last is None: sys.exit(f"study: {d}/log.jsonl has no start or step line")
if last["step"] != int(steps): sys.exit(f"study: {d} ended at step {last['step']}, not {steps}")
if start["config"]["seed"] != int(seed): sys.exit(f"study: {d} was trained with seed {start['config']['seed']}, not {seed}")
f = start["flops"]
tokens = int(last["tokens"])
blimp = e.get("blimp", {}).get("accuracy", "")
print(",".join(str(x) for x in (study, config, variant, seed, steps, tokens, f["n_c"], f["n_n"], f"{f['eta']:.4g}",
      f"{f['rho']:.4g}", f"{6 * f['n_c'] * tokens:.6g}", f"{e['val_loss']:.6f}", e["val_tokens"],
      f"{blimp:.4f}" if blimp != "" else "", wall, commit)))
PY
) || return 1
  study_append "$csv" "$row" || return 1
  echo "study: row -> $csv: $row"
}
