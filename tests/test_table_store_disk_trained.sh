#!/usr/bin/env bash
# A checkpoint trained with --tables disk (its tables in a training store, not in model.safetensors)
# against the same run with RAM tables (tests/lib/tiny_run.sh's model, JTok on every layer):
#   - eval, generate, serve, export without the store, with --tables mmap, or with the training store
#     itself are refused, each saying what to run (export --table-store, then --tables disk);
#     --format gguf / hf, an inference copy (--out) and --init-from are refused; training with
#     --tables disk and --embp is refused saying what to run instead;
#   - `jtok export --table-store` of the disk-trained checkpoint writes the very store (tables.bin and
#     manifest, f32 and int8; the manifest's source also names the training store and its step) that
#     the RAM-trained checkpoint exports, and eval, generate and serve
#     through it give the RAM run's validation loss and tokens;
#   - the step-2 checkpoint of a run killed during step 4 (its store then holds step 2 through the
#     undo log, its rows owing the dense optimizer's deferred steps) exports the RAM run's step-2
#     tables; the step-2 checkpoint of the finished run (its store at step 4) is refused.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
PY=/usr/bin/python3
source "$ROOT/tests/lib/serve_start.sh"
serve_test_env  # T, PIDS (killed by the EXIT trap), fail, one OpenMP thread
source "$ROOT/tests/lib/tiny_run.sh"
SETS=(--set jtok_layers=all --set checkpoint_interval=2 --set keep_checkpoints=2 --set eval_batches=2)
DISK=(--tables disk --table-cache-mb 1)
train_tiny_jtok_model "$T/ram" "${SETS[@]}"
train_tiny_jtok_model "$T/disk" "${SETS[@]}" "${DISK[@]}" --table-store "$T/disk/tstore"
CK=$T/disk/run/checkpoints/step_00000004
[ -f "$CK/table_store.json" ] || fail "the disk-trained checkpoint has no table_store.json"

expect_fail() {  # expect_fail NEEDLE CMD...: the command fails (exit 1, not a crash) and says NEEDLE
  local needle=$1 rc=0; shift
  timeout 120 "$@" > "$T/out.txt" 2>&1 || rc=$?
  [ $rc = 1 ] || { echo "FAIL: exit $rc (not 1): $*"; cat "$T/out.txt"; exit 1; }
  grep -q -- "$needle" "$T/out.txt" || { echo "FAIL: '$*' did not say '$needle':"; cat "$T/out.txt"; exit 1; }
}
ADVICE="--table-store OUT \[--table-dtype bf16|int8|int4\]\`, then pass --tables disk --table-store OUT"
expect_fail "$ADVICE" "$JTOK" eval --checkpoint "$T/disk/run" --no-blimp
expect_fail "$ADVICE" "$JTOK" generate --checkpoint "$CK" --prompt x
expect_fail "$ADVICE" "$JTOK" generate --checkpoint "$CK" --prompt x --tables mmap
expect_fail "$ADVICE" "$JTOK" serve --checkpoint "$CK" --port 0
expect_fail "is a training store" "$JTOK" generate --checkpoint "$CK" --prompt x --tables disk --table-store "$T/disk/tstore"
expect_fail "would hold them whole in memory" "$JTOK" export --checkpoint "$CK" --out "$T/copy"
expect_fail "token-indexed tables" "$JTOK" export --checkpoint "$CK" --format gguf --out "$T/m.gguf"
expect_fail "JTok tables" "$JTOK" export --checkpoint "$CK" --format hf --out "$T/hf"
expect_fail "continue that run with --resume --tables disk" "$JTOK" train --config "$T/disk/cfg.json" --out "$T/up" --init-from "$CK"
expect_fail "jtok embp-plan" "$JTOK" train --config "$T/disk/cfg.json" --out "$T/embp" --embp premix "${DISK[@]}" --table-store "$T/s"

# The exported stores: byte for byte the RAM run's.
for dt in f32 int8; do
  "$JTOK" export --checkpoint "$T/ram/run" --table-store "$T/ram_$dt" --table-dtype $dt > /dev/null
  "$JTOK" export --checkpoint "$CK" --table-store "$T/disk_$dt" --table-dtype $dt > "$T/export_$dt.out"
  grep -q "token-major table store, 5 tables, $dt" "$T/export_$dt.out" || fail "export $dt: $(cat "$T/export_$dt.out")"
  cmp -s "$T/ram_$dt/tables.bin" "$T/disk_$dt/tables.bin" || fail "$dt: tables.bin exported from the disk-trained checkpoint differs from the RAM run's"
  # The manifests are equal but for their source: both step_00000004 at step 4, the disk-trained one
  # also naming its training store, read at step 4.
  $PY - "$T/ram_$dt/manifest.json" "$T/disk_$dt/manifest.json" <<'PYEOF' || fail "$dt: the manifests differ beyond their source"
import json, sys
ram, disk = (json.load(open(p)) for p in sys.argv[1:])
assert ram.pop("source") == {"checkpoint": "step_00000004", "step": 4}, sys.argv[1]
assert disk.pop("source") == {"checkpoint": "step_00000004", "step": 4, "train_store": "tstore", "train_store_step": 4}, sys.argv[2]
assert ram == disk
PYEOF
done
echo "exported stores (f32, int8) identical to the RAM run's: $(cat "$T/export_f32.out")"

# eval, generate and serve through the store: the RAM run's loss and tokens.
gen() { "$JTOK" generate --prompt "The model of the" --temperature 0 --max-new-tokens 24 "$@" 2> /dev/null; }
loss() { "$JTOK" eval --no-blimp --json "$@" | $PY -c 'import json,sys; print(repr(json.load(sys.stdin)["val_loss"]))'; }
"$JTOK" export --checkpoint "$T/ram/run" --out "$T/ram_ck_int8" --table-dtype int8 > /dev/null
for dt in f32 int8; do
  ram_ck=$T/ram/run; [ $dt = int8 ] && ram_ck=$T/ram_ck_int8
  a=$(loss --checkpoint "$ram_ck"); b=$(loss --checkpoint "$T/disk/run" --tables disk --table-store "$T/disk_$dt" --table-cache-mb 1)
  [ "$a" = "$b" ] || fail "$dt: val loss $b through the store, $a for the RAM run"
  gen --checkpoint "$ram_ck" > "$T/ram_$dt.txt"
  gen --checkpoint "$T/disk/run" --tables disk --table-store "$T/disk_$dt" --table-cache-mb 1 > "$T/disk_$dt.txt"
  cmp -s "$T/ram_$dt.txt" "$T/disk_$dt.txt" || fail "$dt: greedy tokens differ: $(cat "$T/ram_$dt.txt" "$T/disk_$dt.txt")"
  echo "$dt: val loss $a and greedy tokens of the RAM run"
done
start_serve ram --checkpoint "$T/ram/run"; RAM=$PORT
start_serve disk --checkpoint "$T/disk/run" --tables disk --table-store "$T/disk_f32" --table-cache-mb 1; DSK=$PORT
$PY - "$RAM" "$DSK" <<'PYEOF' || fail "serve: the disk-trained checkpoint's replies differ"
import json, sys, urllib.request
def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read().decode())["choices"]
for prompt in ([464, 2746, 286, 262], [40000, 17, 3000, 9]):
    body = {"prompt": prompt, "max_tokens": 10, "temperature": 0, "logprobs": 1, "ignore_eos": True}
    a, b = post(sys.argv[1], body), post(sys.argv[2], body)
    assert a == b, (a, b)
PYEOF
echo "serve: replies identical to the RAM run's"

# The store keeps only its newest checkpoint's tables.
expect_fail "is at step 4" "$JTOK" export --checkpoint "$T/disk/run/checkpoints/step_00000002" --table-store "$T/old"
# A run killed in step 4 (the final sync writes every unit): its store, reopened read-only at step 2
# through the undo log, with the rows' deferred steps replayed, gives the RAM run's step-2 tables.
n=$($PY - "$T/disk/run/log.jsonl" "$T/disk/tstore/manifest.json" <<'PYEOF'
import json, sys
unit = json.load(open(sys.argv[2]))["unit_bytes"]
steps = [j for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "step"]
print(sum(j["table_store"]["bytes_written"] for j in steps if j["step"] <= 3) // unit + 1000)
PYEOF
)
rc=0
(export JTOK_TEST_STORE_KILL_AT_WRITE=$n; train_tiny_jtok_model "$T/kill" "${SETS[@]}" "${DISK[@]}" --table-store "$T/kill/tstore") || rc=$?
[ $rc = 137 ] || fail "the run was not killed at write-back $n (rc $rc)"
[ -d "$T/kill/run/checkpoints/step_00000002" ] && [ ! -d "$T/kill/run/checkpoints/step_00000004" ] || fail "kill: not between checkpoints 2 and 4"
"$JTOK" export --checkpoint "$T/ram/run/checkpoints/step_00000002" --table-store "$T/ram_2" > /dev/null
"$JTOK" export --checkpoint "$T/kill/run/checkpoints/step_00000002" --table-store "$T/kill_2" > "$T/kill_2.out"
cmp -s "$T/ram_2/tables.bin" "$T/kill_2/tables.bin" || fail "the killed run's step-2 tables differ from the RAM run's"
grep -Eq "[1-9][0-9]* units from its undo log, [1-9][0-9]* rows brought current" "$T/kill_2.out" ||
  fail "the step-2 export read nothing from the undo log or replayed nothing: $(cat "$T/kill_2.out")"
echo "killed run, step 2: the RAM run's tables; $(cat "$T/kill_2.out")"
echo "PASS"
