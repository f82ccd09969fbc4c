# shellcheck shell=bash
# Shared by the study scripts (study_seeds.sh, study_eta.sh; sourced from the repository root).
#
# A study is a list of training runs. Each finished run appends one row to a CSV under docs/data/
# (committed), written atomically (temp file, fsync, rename) under a lock. A row's key is
# (study, config, variant, seed, steps): a run whose key is already in the CSV is skipped, so a
# study that was stopped continues where it stopped, on this machine or on another one that has the
# committed CSV. A run stopped mid-way resumes from its last checkpoint in its run directory when
# that is still there, else it starts again. Pictures are drawn from the CSVs alone.

STUDY_COLUMNS="study,config,variant,seed,steps,tokens,n_c,n_n,eta,rho,flops_6nd,val_loss,val_tokens,blimp,wall_s,commit"
# A study may add columns after these (the ablations: study_ablate.sh) by setting, before
# study_run, STUDY_EXTRA_COLUMNS to a comma list of these names, filled for each row:
#   knob, knob_value   the ablated config key and its value (STUDY_KNOB, STUDY_KNOB_VALUE of the call)
#   jtokm_aux          JTok-M's load-balancing loss (lambda included, as logged) averaged over the
#                      step lines of the last STUDY_ROUTING_STEPS steps (default 50)
#   load               per JTok-M table (index i of every JTok-M layer's router), its load fraction
#                      averaged over the "routing" records of the last STUDY_ROUTING_STEPS steps and
#                      over the layers, ';'-separated (sums to 1); empty without JTok-M
#   load_min           the smallest such window-averaged load of any table in any one layer
#                      (0 = a table no token chose in the window)
#   tok_s              the median training tokens/s over the run's step lines (step 1 excluded: warm-up)
#   init_from          the checkpoint the run started from (`train --init-from`), relative to the tree
STUDY_EXTRA_COLUMNS=${STUDY_EXTRA_COLUMNS:-}
# STUDY_EVAL_ARGS: extra `jtok eval` arguments of every run (e.g. "--val-batches 64": the first 64
# validation batches, the same for every run; default: the whole validation set).
STUDY_EVAL_ARGS=${STUDY_EVAL_ARGS:-}

# study_columns: the header of this study's CSV.
study_columns() { echo "$STUDY_COLUMNS${STUDY_EXTRA_COLUMNS:+,$STUDY_EXTRA_COLUMNS}"; }

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
      [ "$head" = "$(study_columns)" ] || { echo "study: $csv: header is '$head', expected '$(study_columns)'" >&2; exit 1; }
      cp "$csv" "$csv.tmp"
    else
      study_columns > "$csv.tmp"
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
  case "$study$config$variant$seed$steps${STUDY_KNOB:-}${STUDY_KNOB_VALUE:-}" in *,*) echo "study: fields must not contain commas" >&2; return 1 ;; esac
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
  # shellcheck disable=SC2086
  "$JTOK" eval --checkpoint "$dir" --json "${blimp_args[@]}" $STUDY_EVAL_ARGS > "$dir.eval.json.tmp" || { echo "study: eval of $dir failed" >&2; return 1; }
  mv "$dir.eval.json.tmp" "$dir.eval.json" || return 1
  local wall=$(( $(date +%s) - t0 )) row
  row=$(STUDY_EXTRA_COLUMNS=$STUDY_EXTRA_COLUMNS STUDY_KNOB=${STUDY_KNOB:-} STUDY_KNOB_VALUE=${STUDY_KNOB_VALUE:-} \
        STUDY_ROUTING_STEPS=${STUDY_ROUTING_STEPS:-50} "$PY" - "$dir" "$study" "$config" "$variant" "$seed" "$steps" "$wall" "$STUDY_COMMIT" <<'PY'
import json, os, sys
d, study, config, variant, seed, steps, wall, commit = sys.argv[1:]
e = json.load(open(d + ".eval.json"))
start, last = None, None
step_lines, routing = {}, {}  # by step: a resumed run may log a step twice, the last one counts
for line in open(d + "/log.jsonl"):
    j = json.loads(line)
    if j.get("type") == "start" and start is None: start = j
    if j.get("type") == "step": last = j; step_lines[j["step"]] = j
    if j.get("type") == "routing": routing[j["step"]] = j
if start is None or last is None: sys.exit(f"study: {d}/log.jsonl has no start or step line")
if last["step"] != int(steps): sys.exit(f"study: {d} ended at step {last['step']}, not {steps}")
if start["config"]["seed"] != int(seed): sys.exit(f"study: {d} was trained with seed {start['config']['seed']}, not {seed}")
f = start["flops"]
tokens = int(last["tokens"])
blimp = e.get("blimp", {}).get("accuracy", "")
cells = [study, config, variant, seed, steps, tokens, f["n_c"], f["n_n"], f"{f['eta']:.4g}",
         f"{f['rho']:.4g}", f"{6 * f['n_c'] * tokens:.6g}", f"{e['val_loss']:.6f}", e["val_tokens"],
         f"{blimp:.4f}" if blimp != "" else "", wall, commit]
extra = [c for c in os.environ["STUDY_EXTRA_COLUMNS"].split(",") if c]
if extra:
    first = int(steps) - int(os.environ["STUDY_ROUTING_STEPS"])  # the window: steps first+1 .. steps
    win = [routing[s]["layers"] for s in sorted(routing) if s > first]
    aux = [step_lines[s]["jtokm_aux_loss"] for s in sorted(step_lines) if s > first and "jtokm_aux_loss" in step_lines[s]]
    load, load_min = "", ""
    if win and win[0]:
        nl, ne = len(win[0]), len(win[0][0]["load"])
        per = [[sum(w[l]["load"][i] for w in win) / len(win) for i in range(ne)] for l in range(nl)]  # layer x table
        load = ";".join(f"{sum(p[i] for p in per) / nl:.4f}" for i in range(ne))
        load_min = f"{min(min(p) for p in per):.4f}"
    tps = sorted(step_lines[s]["tokens_per_s"] for s in step_lines if s > 1)
    init = start.get("init_from", "")
    init = os.path.relpath(init) if init else ""
    known = {"knob": os.environ["STUDY_KNOB"], "knob_value": os.environ["STUDY_KNOB_VALUE"],
             "jtokm_aux": f"{sum(aux) / len(aux):.6g}" if aux else "", "load": load, "load_min": load_min,
             "tok_s": f"{tps[len(tps) // 2]:.0f}" if tps else "", "init_from": init}
    for c in extra:
        if c not in known: sys.exit(f"study: STUDY_EXTRA_COLUMNS: unknown column '{c}' (known: {', '.join(known)})")
        cells.append(known[c])
print(",".join(str(x) for x in cells))
PY
) || return 1
  study_append "$csv" "$row" || return 1
  echo "study: row -> $csv: $row"
}
