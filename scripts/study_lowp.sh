#!/usr/bin/env bash
# Low precision on real text (issue 21, "Quality"): configs/exp_jtok.json, baseline and +JTok.
#  1. Training precision: each variant trained in fp32 and in bf16 (--precision bf16) at the same
#     seed, steps and tokens; rows in docs/data/lowp.csv (the fp32 rows also reproduce the seeds
#     study's rows in docs/data/seeds.csv: same seed, same data order).
#  2. Inference exports of the fp32 checkpoints (seed 1 unless --export-seeds): weights in bf16 /
#     int8 (`jtok export --weight-dtype`), tables in bf16 / int8 (`--table-dtype`, +JTok only), and
#     both in int8: validation loss of each against its fp32 source and the greedy agreement of 64
#     new tokens on 4 validation prompts; rows in docs/data/lowp_export.csv.
# Rows already in a CSV are skipped (scripts/study_lib.sh), so a stopped study continues.
#   scripts/study_lowp.sh [--seeds 1,2,3] [--steps 200] [--export-seeds 1] [--out runs/study_lowp] [--csv-dir docs/data] [--report-only]
#  3. With --kl: the same exports, each against its fp32 source on the first --kl-batches validation
#     batches (`jtok eval --reference`: mean / largest KL of the next-token distribution, top-1
#     agreement, log p(target) change); rows in docs/data/lowp_export_kl.csv. Needs the fp32
#     checkpoints of the export seeds (runs/study_lowp, or trains them as step 1 does).
# One process, one run at a time; set OMP_NUM_THREADS (and nice) from outside.
KL_COLUMNS="config,variant,seed,steps,weight_dtype,table_dtype,val_batches,positions,top1_agreement,kl_mean,kl_max,dlogp_mean,dlogp_abs_mean,dlogp_abs_max,commit"
EXPORT_COLUMNS="config,variant,seed,steps,weight_dtype,table_dtype,val_loss,val_loss_f32,delta,greedy_same,greedy_total,file_mb,file_mb_f32,commit"

# has_row CSV KEY NFIELDS: true when the CSV has a row whose first NFIELDS fields are KEY.
has_row() { [ -f "$1" ] && cut -d, -f1-"$3" "$1" | grep -qxF -- "$2"; }

# make_export SRC_DIR WEIGHT_DT TABLE_DT OUT_DIR: `jtok export` of SRC_DIR into OUT_DIR.
make_export() {
  local src=$1 wdt=$2 tdt=$3 out=$4
  rm -rf "$out"
  "$JTOK" export --checkpoint "$src" --weight-dtype "$wdt" --table-dtype "$tdt" --out "$out" > "$out.export.out" 2>&1 ||
    { echo "study_lowp: export failed, see $out.export.out" >&2; return 1; }
}

# export_row SRC_DIR VARIANT SEED STEPS WEIGHT_DT TABLE_DT OUT_DIR: exports, evaluates, compares
# greedy tokens with the fp32 source and appends a row to $EXPORT_CSV unless it is there.
export_row() {
  local src=$1 variant=$2 seed=$3 steps=$4 wdt=$5 tdt=$6 out=$7
  local key="configs/exp_jtok.json,$variant,$seed,$steps,$wdt,$tdt"
  if has_row "$EXPORT_CSV" "$key" 6; then
    echo "study_lowp: export $key is in $EXPORT_CSV, skipping"; return 0
  fi
  make_export "$src" "$wdt" "$tdt" "$out" || return 1
  [ -f "$src.eval.json" ] || "$JTOK" eval --checkpoint "$src" --json --no-blimp > "$src.eval.json"
  "$JTOK" eval --checkpoint "$out" --json --no-blimp > "$out.eval.json" || return 1
  local same=0 total=0 p out_dir; out_dir=$(dirname "$out")
  for p in 0 1 2 3; do
    local prompt; prompt=$(sed -n "$((p * 40 + 1)),$((p * 40 + 3))p" "$out_dir/val_prompts.txt" | tr '\n' ' ')
    [ -f "$src.greedy$p.json" ] || "$JTOK" generate --checkpoint "$src" --prompt "$prompt" --temperature 0 --no-stop \
      --max-new-tokens 64 --ids-out "$src.greedy$p.json" > /dev/null 2>&1 || return 1
    "$JTOK" generate --checkpoint "$out" --prompt "$prompt" --temperature 0 --no-stop --max-new-tokens 64 \
      --ids-out "$out.greedy$p.json" > /dev/null 2>&1 || return 1
    local r; r=$("$PY" - "$src.greedy$p.json" "$out.greedy$p.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
ga, gb = a["generated_ids"], b["generated_ids"]
n = 0
while n < min(len(ga), len(gb)) and ga[n] == gb[n]: n += 1
print(n, len(ga))
PY
) || return 1
    same=$((same + ${r% *})); total=$((total + ${r#* }))
  done
  local row
  row=$("$PY" - "$src" "$out" "$key" "$same" "$total" "$STUDY_COMMIT" <<'PY'
import json, os, sys
src, out, key, same, total, commit = sys.argv[1:]
def mb(d): return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs if f.endswith(".safetensors") and not f.startswith("optimizer")) / 1e6
def ckpt(d):  # a run directory: its newest checkpoint
    c = os.path.join(d, "checkpoints")
    return os.path.join(c, sorted(os.listdir(c))[-1]) if os.path.isdir(c) else d
l32 = json.load(open(src + ".eval.json"))["val_loss"]
l = json.load(open(out + ".eval.json"))["val_loss"]
print(f"{key},{l:.6f},{l32:.6f},{l - l32:+.2e},{same},{total},{mb(out):.1f},{mb(ckpt(src)):.1f},{commit}")
PY
) || return 1
  STUDY_COLUMNS=$EXPORT_COLUMNS STUDY_EXTRA_COLUMNS="" study_append "$EXPORT_CSV" "$row"
  echo "study_lowp: row -> $EXPORT_CSV: $row"
  rm -rf "$out"  # the numbers are kept; the copy is cheap to make again
}

# kl_row SRC_DIR VARIANT SEED STEPS WEIGHT_DT TABLE_DT OUT_DIR BATCHES: exports, compares with the
# fp32 source (`eval --reference`) and appends a row to $KL_CSV unless it is there.
kl_row() {
  local src=$1 variant=$2 seed=$3 steps=$4 wdt=$5 tdt=$6 out=$7 nb=$8
  local key="configs/exp_jtok.json,$variant,$seed,$steps,$wdt,$tdt,$nb"
  if has_row "$KL_CSV" "$key" 7; then
    echo "study_lowp: kl $key is in $KL_CSV, skipping"; return 0
  fi
  make_export "$src" "$wdt" "$tdt" "$out" || return 1
  "$JTOK" eval --checkpoint "$out" --reference "$src" --val-batches "$nb" --json --no-blimp > "$out.kl.json" || return 1
  local row
  row=$("$PY" - "$out.kl.json" "$key" "$STUDY_COMMIT" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["reference"]
print(f"{sys.argv[2]},{r['positions']},{r['top1_agreement']:.6f},{r['kl_mean']:.4e},{r['kl_max']:.4e},"
      f"{r['dlogp_mean']:+.4e},{r['dlogp_abs_mean']:.4e},{r['dlogp_abs_max']:.4e},{sys.argv[3]}")
PY
) || return 1
  STUDY_COLUMNS=$KL_COLUMNS STUDY_EXTRA_COLUMNS="" study_append "$KL_CSV" "$row"
  echo "study_lowp: row -> $KL_CSV: $row"
  rm -rf "$out"
}

main() {
  set -euo pipefail
  cd "$(dirname "$0")/.."
  . scripts/study_lib.sh
  local seeds=1,2,3 steps=200 export_seeds=1 csv_dir=docs/data out=runs/study_lowp report_only=0 kl=0 kl_batches=46
  while [ $# -gt 0 ]; do
    case "$1" in
      --seeds) seeds=$2; shift 2 ;;
      --steps) steps=$2; shift 2 ;;
      --export-seeds) export_seeds=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      --csv-dir) csv_dir=$2; shift 2 ;;
      --report-only) report_only=1; shift ;;
      --kl) kl=1; shift ;;
      --kl-batches) kl_batches=$2; shift 2 ;;
      *) echo "usage: $0 [--seeds LIST] [--steps N] [--export-seeds LIST] [--out DIR] [--csv-dir DIR] [--kl [--kl-batches N]] [--report-only]" >&2; exit 2 ;;
    esac
  done
  local csv=$csv_dir/lowp.csv
  EXPORT_CSV=$csv_dir/lowp_export.csv
  KL_CSV=$csv_dir/lowp_export_kl.csv
  PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
  if [ $kl = 1 ] && [ $report_only = 0 ]; then
    study_setup
    mkdir -p "$out"
    local s v
    for s in ${export_seeds//,/ }; do
      for v in base jtok; do
        local jt=false; [ $v = jtok ] && jt=true
        local src="$out/${v}_f32_s${s}_n$steps"
        study_run "$csv" lowp configs/exp_jtok.json "$v" "$s" "$steps" 0 "$src" --jtok $jt
        kl_row "$src" "$v" "$s" "$steps" bf16 f32 "$out/k_${v}_s${s}_wbf16" "$kl_batches"
        kl_row "$src" "$v" "$s" "$steps" int8 f32 "$out/k_${v}_s${s}_wint8" "$kl_batches"
        if [ $v = jtok ]; then
          kl_row "$src" "$v" "$s" "$steps" f32 bf16 "$out/k_${v}_s${s}_tbf16" "$kl_batches"
          kl_row "$src" "$v" "$s" "$steps" f32 int8 "$out/k_${v}_s${s}_tint8" "$kl_batches"
          kl_row "$src" "$v" "$s" "$steps" int8 int8 "$out/k_${v}_s${s}_wint8_tint8" "$kl_batches"
        fi
      done
    done
    report_only=1
  fi
  if [ $report_only = 0 ]; then
    study_setup
    mkdir -p "$out"
    # Validation prompts: non-empty lines of the validation documents (data/text/val, made by prepare_data.sh).
    awk 'NF { print; if (++n == 200) exit }' data/text/val/*.txt > "$out/val_prompts.txt"
    local s v
    for s in ${seeds//,/ }; do
      for v in base jtok; do
        local jt=false; [ $v = jtok ] && jt=true
        study_run "$csv" lowp configs/exp_jtok.json "$v" "$s" "$steps" 0 "$out/${v}_f32_s${s}_n$steps" --jtok $jt
        if [[ ",$export_seeds," == *",$s,"* ]]; then
          local src="$out/${v}_f32_s${s}_n$steps"
          export_row "$src" "$v" "$s" "$steps" bf16 f32 "$out/x_${v}_s${s}_wbf16"
          export_row "$src" "$v" "$s" "$steps" int8 f32 "$out/x_${v}_s${s}_wint8"
          if [ $v = jtok ]; then
            export_row "$src" "$v" "$s" "$steps" f32 bf16 "$out/x_${v}_s${s}_tbf16"
            export_row "$src" "$v" "$s" "$steps" f32 int8 "$out/x_${v}_s${s}_tint8"
            export_row "$src" "$v" "$s" "$steps" int8 int8 "$out/x_${v}_s${s}_wint8_tint8"
          fi
        fi
        study_run "$csv" lowp configs/exp_jtok.json "${v}_bf16" "$s" "$steps" 0 "$out/${v}_bf16_s${s}_n$steps" --jtok $jt --precision bf16
      done
    done
  fi
  "$PY" scripts/study_lowp_report.py "$csv" "$EXPORT_CSV" "$KL_CSV"
}
# The whole script is read before it runs (main at the end), so editing it while a study runs is safe.
main "$@"; exit
