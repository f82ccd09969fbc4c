#!/usr/bin/env bash
# int4 token tables on a trained checkpoint (issue 30, "Beyond"): configs/exp_jtok.json with JTok on
# every layer and JTok-M (n_e 4, K 2) on layer 3, trained on the real corpus (data/train), then its
# tables stored in low precision and each copy compared with the f32 checkpoint on the first
# --val-batches validation batches (`jtok eval --reference`: validation loss of both, top-1
# agreement, mean / largest KL of the next-token distribution). Copies:
#   int8        `jtok export --table-dtype int8` (per-row scale)
#   int4        `jtok export --table-dtype int4` (per-row scale, levels -7..7; src/ops/int4_rows.h)
#   int4_np     the same round trip computed in numpy (scripts/fakequant_tables.py --block row):
#               an independent check of the engine's int4 path (its KL row must equal int4's)
#   int4_b32    int4 with one scale per 32 values of a row (numpy; not a stored format)
#   int4_jtok   int4 per row on JTok's tables only, JTok-M's in f32 (numpy)
#   int4_jtokm  int4 per row on JTok-M's tables only, JTok's in f32 (numpy)
# Rows in docs/data/lowp_int4.csv (a variant already there is skipped; scripts/study_lib.sh).
#   scripts/study_int4.sh [--steps 200] [--seed 1] [--val-batches 46] [--out runs/study_int4] [--csv docs/data/lowp_int4.csv]
# One process, one run at a time; set OMP_NUM_THREADS (and nice) from outside. A finished training
# run in OUT/run (its step-N checkpoint) is reused, whichever binary trained it.
COLUMNS="config,variant,seed,steps,tables,val_batches,positions,val_loss_f32,val_loss,delta,top1_agreement,kl_mean,kl_max,dlogp_abs_mean,table_mb,commit"
TRAIN_ARGS=(--jtok true --jtokm true --jtokm_layers 3 --jtokm_n_e 4 --jtokm_top_k 2)

# copy VARIANT SRC OUT: the low-precision copy of checkpoint SRC for VARIANT at OUT.
copy() {
  local v=$1 src=$2 out=$3
  rm -rf "$out"
  case $v in
    int8|int4) "$JTOK" export --checkpoint "$src" --table-dtype "$v" --out "$out" > "$out.out" 2>&1 ;;
    int4_np) "$PY" scripts/fakequant_tables.py "$src" "$out" --block row > "$out.out" 2>&1 ;;
    int4_b32) "$PY" scripts/fakequant_tables.py "$src" "$out" --block 32 > "$out.out" 2>&1 ;;
    int4_jtok) "$PY" scripts/fakequant_tables.py "$src" "$out" --match 'jtok\.embed' > "$out.out" 2>&1 ;;
    int4_jtokm) "$PY" scripts/fakequant_tables.py "$src" "$out" --match 'jtokm\.embed' > "$out.out" 2>&1 ;;
    *) echo "study_int4: unknown variant $v" >&2; return 1 ;;
  esac || { echo "study_int4: copy $v failed, see $out.out" >&2; return 1; }
}

main() {
  set -euo pipefail
  cd "$(dirname "$0")/.."
  . scripts/study_lib.sh
  local steps=200 seed=1 nb=46 out=runs/study_int4 csv=docs/data/lowp_int4.csv
  while [ $# -gt 0 ]; do
    case "$1" in
      --steps) steps=$2; shift 2 ;;
      --seed) seed=$2; shift 2 ;;
      --val-batches) nb=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      --csv) csv=$2; shift 2 ;;
      *) echo "usage: $0 [--steps N] [--seed S] [--val-batches N] [--out DIR] [--csv FILE]" >&2; exit 2 ;;
    esac
  done
  study_setup
  mkdir -p "$out"
  local run=$out/run ck
  ck=$run/checkpoints/step_$(printf %08d "$steps")
  if [ ! -f "$ck/COMPLETE" ]; then
    local resume=(); [ -d "$run/checkpoints" ] && resume=(--resume)
    echo "study_int4: training $run ($steps steps)"
    "$JTOK" train --config configs/exp_jtok.json "${TRAIN_ARGS[@]}" --seed "$seed" --max-steps "$steps" \
      --set checkpoint_interval="$steps" --out "$run" --peak-gflops 1 "${resume[@]}" > "$run.train.out" 2>&1 ||
      { echo "study_int4: training failed, see $run.train.out" >&2; return 1; }
  fi
  local v
  for v in int8 int4 int4_b32 int4_jtok int4_jtokm int4_np; do
    local key="configs/exp_jtok.json+jtokm3,$v,$seed,$steps"
    if [ -f "$csv" ] && cut -d, -f1-4 "$csv" | grep -qxF -- "$key"; then
      echo "study_int4: $key is in $csv, skipping"; continue
    fi
    copy "$v" "$ck" "$out/$v"
    "$JTOK" eval --checkpoint "$out/$v" --reference "$ck" --val-batches "$nb" --json --no-blimp > "$out/$v.json"
    local row
    row=$("$PY" - "$out/$v.json" "$out/$v" "$key" "$nb" "$STUDY_COMMIT" <<'PY'
import json, re, struct, sys
res, copy, key, nb, commit = sys.argv[1:]
j = json.load(open(res))
r = j["reference"]
with open(copy + "/model.safetensors", "rb") as f:  # the tables' bytes in the copy (scales included)
    h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
table = re.compile(r"^model\.layers\.\d+\.(jtok\.embed|jtokm\.embed\.\d+)\.weight(_scale)?$")
mb = sum(e["data_offsets"][1] - e["data_offsets"][0] for k, e in h.items() if table.match(k)) / 1e6
n = sum(1 for k in h if table.match(k) and not k.endswith("_scale"))
print(f"{key},{n},{nb},{r['positions']},{r['val_loss']:.6f},{j['val_loss']:.6f},{j['val_loss'] - r['val_loss']:+.3e},"
      f"{r['top1_agreement']:.6f},{r['kl_mean']:.4e},{r['kl_max']:.4e},{r['dlogp_abs_mean']:.4e},{mb:.1f},{commit}")
PY
)
    STUDY_COLUMNS=$COLUMNS STUDY_EXTRA_COLUMNS="" study_append "$csv" "$row"
    echo "study_int4: row -> $csv: $row"
    rm -rf "${out:?}/${v:?}"
  done
}
# The whole script is read before it runs (main at the end), so editing it while a study runs is safe.
main "$@"; exit
