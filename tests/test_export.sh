#!/usr/bin/env bash
# jtok export --fold-jtok: the exported directory loads like a checkpoint; its validation loss is
# within 1e-6 (relative) of the source's and greedy generation gives the same text; a second
# export into an existing directory and an unsupported table dtype are refused.
# --table-dtype bf16 / int8: the file shrinks, eval's loss stays within 1 % of f32's, generate reads
# the quantized tables in RAM and mapped alike; a quantized export cannot be quantized again.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
PY=/usr/bin/python3
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=1
source "$ROOT/tests/lib/tiny_run.sh"
train_tiny_jtok_model "$T" --set jtok_layers=all --set jtok_scale_init=0.7 --set jtokm_scale_init=1.0
"$JTOK" export --checkpoint "$T/run" --out "$T/folded" --fold-jtok | grep -q "2 JTok tables folded" || { echo "FAIL: export"; exit 1; }
grep -q '"jtok_norm": false' "$T/folded/config.json" || { echo "FAIL: folded config keeps the norm"; exit 1; }
for c in run folded; do
  "$JTOK" eval --checkpoint "$T/$c" --no-blimp --json > "$T/eval_$c.json"
  "$JTOK" generate --checkpoint "$T/$c" --prompt "The model" --temperature 0 --max-new-tokens 20 > "$T/gen_$c.txt" 2> /dev/null
done
$PY -c 'import json,sys; a,b=(json.load(open(f))["val_loss"] for f in sys.argv[1:]); print(f"val loss {a!r} unfolded, {b!r} folded"); assert abs(a-b) <= 1e-6*abs(a), (a,b)' \
  "$T/eval_run.json" "$T/eval_folded.json" || { echo "FAIL: folded loss differs"; exit 1; }
cmp -s "$T/gen_run.txt" "$T/gen_folded.txt" || { echo "FAIL: folded generation differs"; cat "$T/gen_run.txt" "$T/gen_folded.txt"; exit 1; }
! "$JTOK" export --checkpoint "$T/run" --out "$T/folded" 2> /dev/null || { echo "FAIL: export over an existing directory"; exit 1; }
! "$JTOK" export --checkpoint "$T/run" --out "$T/x" --table-dtype fp8 2> /dev/null || { echo "FAIL: fp8 accepted"; exit 1; }
for dt in bf16 int8; do
  "$JTOK" export --checkpoint "$T/run" --out "$T/$dt" --fold-jtok --table-dtype $dt | grep -q "tables $dt" || { echo "FAIL: export $dt"; exit 1; }
  "$JTOK" eval --checkpoint "$T/$dt" --no-blimp --json > "$T/eval_$dt.json"
  for tb in ram mmap; do
    "$JTOK" generate --checkpoint "$T/$dt" --tables $tb --prompt "The model" --temperature 0 --max-new-tokens 20 > "$T/gen_${dt}_$tb.txt" 2> /dev/null
  done
  cmp -s "$T/gen_${dt}_ram.txt" "$T/gen_${dt}_mmap.txt" || { echo "FAIL: $dt tables: mmap generation differs from ram"; exit 1; }
  ! "$JTOK" export --checkpoint "$T/$dt" --out "$T/${dt}_again" --table-dtype int8 2> /dev/null || { echo "FAIL: re-quantized $dt"; exit 1; }
done
# With the backbone's own --weight-dtype too: both quantized, ram = mmap.
"$JTOK" export --checkpoint "$T/run" --out "$T/both" --weight-dtype int8 --table-dtype int8 | grep -q "weights int8, tables int8" ||
  { echo "FAIL: export --weight-dtype int8 --table-dtype int8"; exit 1; }
for tb in ram mmap; do
  "$JTOK" generate --checkpoint "$T/both" --tables $tb --prompt "The model" --temperature 0 --max-new-tokens 20 > "$T/gen_both_$tb.txt" 2> /dev/null
done
cmp -s "$T/gen_both_ram.txt" "$T/gen_both_mmap.txt" || { echo "FAIL: int8 weights + tables: mmap generation differs from ram"; exit 1; }
$PY - "$T" <<'PY' || { echo "FAIL: quantized tables"; exit 1; }
import json, os, sys
t = sys.argv[1]
f32 = os.path.getsize(f"{t}/folded/model.safetensors")
loss = {k: json.load(open(f"{t}/eval_{k}.json"))["val_loss"] for k in ("folded", "bf16", "int8")}
for k in ("bf16", "int8"):
    size = os.path.getsize(f"{t}/{k}/model.safetensors")
    print(f"{k}: {size} bytes ({f32 / size:.2f}x smaller), val loss {loss[k]:.5f} vs {loss['folded']:.5f}")
    assert size < f32, (k, size, f32)
    assert abs(loss[k] - loss["folded"]) <= 0.01 * loss["folded"], (k, loss)
PY
echo PASS
