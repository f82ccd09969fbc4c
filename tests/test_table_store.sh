#!/usr/bin/env bash
# --tables disk: `jtok export --table-store` writes the token tables of a dense + JTok + JTok-M
# model as a token-major store (f32, bf16, int8, int4), and generate and eval reading them from the
# store (through a cache far smaller than the tables) give the tokens and the validation loss of the
# same tables in RAM, bit for bit (int4 also memory-mapped), read the default way (--table-io auto:
# O_DIRECT where the file system takes it) and through the page cache (--table-io pread); on a file
# system without O_DIRECT (the fault shim's no_direct) auto reads with pread and says so, the same
# tokens, and --table-io direct is refused naming the file; opening a store prints its source (the
# checkpoint and step it was exported from). Refused, naming the flag or the manifest: --tables disk
# without a store, a store with --tables ram, --table-direct-io without --tables disk, a store over
# an existing directory, a store of another model; int4 tables for training and int4 weights.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=1
source "$ROOT/tests/lib/tiny_run.sh"
train_tiny_jtok_model "$T" --set jtok_layers=all --set jtok_scale_init=0.7 --set jtokm_scale_init=0.5 --set eval_batches=2
gen() { "$JTOK" generate --prompt "The model of the" --temperature 0 --max-new-tokens 24 "$@" 2> /dev/null; }
loss() { "$JTOK" eval --no-blimp --json "$@" | /usr/bin/python3 -c 'import json,sys; print(repr(json.load(sys.stdin)["val_loss"]))'; }
for dt in f32 bf16 int8 int4; do
  "$JTOK" export --checkpoint "$T/run" --table-store "$T/store_$dt" --table-dtype $dt | grep -q "token-major table store, 5 tables, $dt" ||
    { echo "FAIL: export --table-store $dt"; exit 1; }
  ram_ck="$T/run"
  if [ $dt != f32 ]; then "$JTOK" export --checkpoint "$T/run" --out "$T/ck_$dt" --table-dtype $dt > /dev/null; ram_ck="$T/ck_$dt"; fi
  gen --checkpoint "$ram_ck" > "$T/ram_$dt.txt"
  # 1 MB of cache: the store holds 50,304 tokens x 5 rows of 32 (f32: 32 MB).
  gen --checkpoint "$T/run" --tables disk --table-store "$T/store_$dt" --table-cache-mb 1 > "$T/disk_$dt.txt"
  cmp -s "$T/ram_$dt.txt" "$T/disk_$dt.txt" || { echo "FAIL: $dt: disk generation differs"; cat "$T/ram_$dt.txt" "$T/disk_$dt.txt"; exit 1; }
  a=$(loss --checkpoint "$ram_ck"); b=$(loss --checkpoint "$T/run" --tables disk --table-store "$T/store_$dt" --table-cache-mb 1)
  [ "$a" = "$b" ] || { echo "FAIL: $dt: val loss $b from the store, $a in RAM"; exit 1; }
  echo "$dt: greedy tokens and val loss $a identical from the store"
done
# The default reads with O_DIRECT where the test directory's file system allows it (tmpfs before
# Linux 6.6 does not); --table-io pread reads through the page cache: the same tokens and loss.
DIRECT=pread; /usr/bin/python3 -c 'import os,sys; os.close(os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT))' \
  "$T/store_f32/tables.bin" 2> /dev/null && DIRECT=O_DIRECT
F32=(--checkpoint "$T/run" --tables disk --table-store "$T/store_f32" --table-cache-mb 1)
"$JTOK" generate --prompt x --max-new-tokens 1 "${F32[@]}" > /dev/null 2> "$T/auto.err"
grep -q "; reads with $DIRECT" "$T/auto.err" ||
  { echo "FAIL: --table-io auto does not say it reads with $DIRECT"; exit 1; }
gen "${F32[@]}" --table-io pread > "$T/pread.txt"
cmp -s "$T/ram_f32.txt" "$T/pread.txt" || { echo "FAIL: --table-io pread generation differs"; cat "$T/ram_f32.txt" "$T/pread.txt"; exit 1; }
a=$(loss --checkpoint "$T/run"); b=$(loss "${F32[@]}" --table-io pread)
[ "$a" = "$b" ] || { echo "FAIL: --table-io pread: val loss $b, $a in RAM"; exit 1; }
echo "--table-io auto reads with $DIRECT; --table-io pread: greedy tokens and val loss $a identical"
# A file system without O_DIRECT: auto falls back to pread and says so; direct is refused naming the file.
source "$ROOT/tests/lib/fault_shim.sh"
PRE=$(fault_preload_list "$JTOK")
nodirect() { LD_PRELOAD=$PRE JTOK_FAULT_KIND=no_direct JTOK_FAULT_PATH_SUBSTR='store_f32/tables.bin$' "$@"; }
nodirect "$JTOK" generate --prompt "The model of the" --temperature 0 --max-new-tokens 24 "${F32[@]}" > "$T/nodirect.txt" 2> "$T/nodirect.err"
grep -q "; reads with pread (its file system has no O_DIRECT)" "$T/nodirect.err" ||
  { echo "FAIL: auto on a file system without O_DIRECT: $(cat "$T/nodirect.err")"; exit 1; }
cmp -s "$T/ram_f32.txt" "$T/nodirect.txt" || { echo "FAIL: auto's pread fallback generation differs"; exit 1; }
rc=0; nodirect "$JTOK" generate --prompt x --max-new-tokens 1 "${F32[@]}" --table-io direct > "$T/out.txt" 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "cannot open $T/store_f32/tables.bin for direct I/O (--table-io direct): Invalid argument" "$T/out.txt" ||
  { echo "FAIL: --table-io direct without O_DIRECT (exit $rc): $(cat "$T/out.txt")"; exit 1; }
echo "no O_DIRECT: auto falls back to pread (same tokens), --table-io direct is refused naming the file"
# The store names its source on open: the checkpoint's directory and step.
"$JTOK" generate --prompt x --max-new-tokens 1 --checkpoint "$T/run" --tables disk --table-store "$T/store_f32" > /dev/null 2> "$T/src.err"
grep -q "table store $T/store_f32: exported from checkpoint step_00000004, step 4" "$T/src.err" ||
  { echo "FAIL: generate --tables disk does not print the store's source: $(cat "$T/src.err")"; exit 1; }
gen --checkpoint "$T/ck_int4" --tables mmap > "$T/mmap_int4.txt"
cmp -s "$T/ram_int4.txt" "$T/mmap_int4.txt" || { echo "FAIL: int4: mmap generation differs from RAM"; exit 1; }
cmp -s "$T/ram_int4.txt" "$T/ram_int8.txt" && echo "note: int4 and int8 tables give the same greedy tokens here"
expect_fail() {  # expect_fail NEEDLE CMD...: the command fails and says NEEDLE
  local needle=$1; shift
  if "$@" > "$T/out.txt" 2>&1; then echo "FAIL: accepted: $*"; exit 1; fi
  grep -q -- "$needle" "$T/out.txt" || { echo "FAIL: '$*' did not say '$needle':"; cat "$T/out.txt"; exit 1; }
}
expect_fail "needs --table-store" "$JTOK" generate --prompt x --checkpoint "$T/run" --tables disk
expect_fail "is for --tables disk" "$JTOK" generate --prompt x --checkpoint "$T/run" --table-store "$T/store_f32"
expect_fail "--table-direct-io is for --tables disk" "$JTOK" generate --prompt x --checkpoint "$T/run" --table-direct-io
expect_fail "--table-io must be auto, direct or pread, got 'odirect'" "$JTOK" generate --prompt x "${F32[@]}" --table-io odirect
expect_fail "--table-direct-io and --table-io pread disagree" "$JTOK" generate --prompt x "${F32[@]}" --table-io pread --table-direct-io
expect_fail "exists" "$JTOK" export --checkpoint "$T/run" --table-store "$T/store_f32"
sed -e 's/"jtokm_n_e": 3/"jtokm_n_e": 2/' -e 's/"max_steps": 4/"max_steps": 1/' -e 's/"checkpoint_interval": 4/"checkpoint_interval": 1/' "$T/cfg.json" > "$T/cfg2.json"
"$JTOK" train --config "$T/cfg2.json" --out "$T/run2" --peak-gflops 1 > /dev/null
expect_fail "manifest.json" "$JTOK" generate --prompt x --checkpoint "$T/run2" --tables disk --table-store "$T/store_f32"
expect_fail "--weight-dtype" "$JTOK" export --checkpoint "$T/run" --out "$T/w4" --weight-dtype int4
mkdir -p "$T/run4/checkpoints" && cp -r "$T/ck_int4" "$T/run4/checkpoints/step_00000004"
expect_fail "training needs f32 tables" "$JTOK" train --config "$T/cfg.json" --out "$T/run4" --resume --max-steps 5 --peak-gflops 1 \
  --set jtok_layers=all --set jtok_scale_init=0.7 --set jtokm_scale_init=0.5
echo "PASS"
