#!/usr/bin/env bash
# Writes that fail (the file size limit RLIMIT_FSIZE stands in for a full disk: write() returns
# EFBIG once a file would grow past it; SIGXFSZ is ignored so the process sees the error) lose
# nothing: a checkpoint that cannot be written stops the run with an error naming the file, leaves
# no checkpoint under its final name, and the previous checkpoint stays complete, unchanged and
# resumable; a shard that cannot be written stops `prepare` naming it, leaving no *.bin behind.
# Then the same with the LD_PRELOAD shim tests/faults/write_fault_shim.cpp, one fault kind at a time:
# a short write followed by ENOSPC, EIO on write, EIO on fsync, a failing rename (of a file, of the
# checkpoint directory, of COMPLETE); and legal short writes (at most 1000 bytes a call) that must
# give byte-identical files. `export --out` under the shim: nothing left but what was published.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
source "$ROOT/tests/lib/tiny_run.sh"
prepare_tiny_corpus "$T/data"
cat > "$T/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 32, "max_position_embeddings": 16, "jtok": true,
  "seq_len": 16, "micro_batch_size": 2, "max_steps": 8, "lr_scheduler_type": "constant", "checkpoint_interval": 4, "keep_checkpoints": 1,
  "eval_interval": 1000, "eval_batches": 1, "sample_interval": 0,
  "train_data": "$T/data/train", "val_data": "$T/data/val" }
JSON
export OMP_NUM_THREADS=1
"$JTOK" train --config "$T/cfg.json" --out "$T/straight" --peak-gflops 1 > /dev/null  # 8 steps, no fault
step_losses "$T/straight/log.jsonl" > "$T/straight.losses"
"$JTOK" train --config "$T/cfg.json" --out "$T/x" --max-steps 4 --peak-gflops 1 > /dev/null
cp -a "$T/x" "$T/x4"  # the run after step 4, for the shim's cases
ck="$T/x/checkpoints/step_00000004"
# checkpoints_kept RUN: the names of RUN's checkpoints, less the temporary ones (*.tmp), space-separated.
checkpoints_kept() {
  local f names=()
  for f in "$1"/checkpoints/*; do
    [ -e "$f" ] && [[ $f != *.tmp ]] && names+=("$(basename "$f")")
  done
  echo "${names[*]}"
}
md5sum "$ck"/* > "$T/before.md5"
size_kb=$(( $(stat -c %s "$ck/model.safetensors") / 1024 ))

# The next checkpoint (step 8) cannot be written: the limit is half of model.safetensors.
if ( trap '' XFSZ; ulimit -f $((size_kb / 2)); exec "$JTOK" train --config "$T/cfg.json" --out "$T/x" --resume \
       --peak-gflops 1 ) > "$T/full.out" 2>&1; then fail "a failed checkpoint write did not fail the run"; fi
tail -n 1 "$T/full.out"
grep -q "cannot write .*model.safetensors.*File too large" "$T/full.out" || fail "the error does not name the file"
[ "$(checkpoints_kept "$T/x")" = step_00000004 ] || fail "checkpoints after the failure: $(ls "$T/x/checkpoints")"
md5sum -c --quiet "$T/before.md5" || fail "the previous checkpoint changed"
find "$T/x/checkpoints" -name '*.safetensors' ! -path '*.tmp/*' | while read -r f; do
  case "$f" in "$ck"/*) ;; *) fail "a file under a final name: $f" ;; esac
done
"$JTOK" eval --checkpoint "$T/x" --no-blimp --json --val-batches 1 | grep -q '"checkpoint":"[^"]*step_00000004"' ||
  fail "eval does not load the previous checkpoint"
"$JTOK" train --config "$T/cfg.json" --out "$T/x" --resume --peak-gflops 1 > "$T/resume.out"
grep -q "resume: from $ck" "$T/resume.out" || fail "did not resume from step 4"
[ "$(ls "$T/x/checkpoints")" = step_00000008 ] || fail "after the resumed run: $(ls "$T/x/checkpoints")"
echo "ok: a checkpoint write that fails loses nothing; the run resumes"

# prepare: the first shard (about 40 kB: 2 bytes a token) cannot be written under a 20 kB limit.
if ( trap '' XFSZ; ulimit -f 20; exec "$JTOK" prepare --tokenizer gpt2 --out "$T/p" --shard-tokens 20000 \
       "$ROOT"/tests/data/corpus/*.md ) > "$T/prep.out" 2>&1; then fail "a failed shard write did not fail prepare"; fi
tail -n 1 "$T/prep.out"
grep -q "shard .*\.bin" "$T/prep.out" || fail "the error does not name the shard"
[ -z "$(find "$T/p" -name '*.bin' 2>/dev/null)" ] || fail "a shard was left: $(find "$T/p" -name '*.bin')"
[ -z "$(find "$T/p" -name '.*tmp*' 2>/dev/null)" ] || fail "a temporary file was left"
echo "ok: a shard write that fails leaves no shard"

# ---- The LD_PRELOAD shim ----
. "$(dirname "$0")/lib/fault_shim.sh"
PRE=$(fault_preload_list "$JTOK") || fail "no fault shim"
with_fault() {  # KIND SUBSTR AFTER_BYTES COMMAND...: runs COMMAND with the fault
  local kind=$1 sub=$2 after=$3; shift 3
  LD_PRELOAD=$PRE JTOK_FAULT_KIND=$kind JTOK_FAULT_PATH_SUBSTR=$sub JTOK_FAULT_AFTER_BYTES=$after "$@"
}
ck4=checkpoints/step_00000004
half=$(( $(stat -c %s "$T/x4/$ck4/model.safetensors") / 2 ))

# Checkpoint at step 8, each fault: the run fails naming the file, step 4 stays complete, unchanged,
# the newest; nothing of step 8 under a final name; --resume then gives the straight run's losses.
ckpt_case() {  # KIND SUBSTR AFTER_BYTES EXPECTED_MESSAGE_REGEX
  local kind=$1 sub=$2 after=$3 want=$4 d="$T/ck_$1_$RANDOM"
  cp -a "$T/x4" "$d"
  if with_fault "$kind" "$sub" "$after" "$JTOK" train --config "$T/cfg.json" --out "$d" --resume --peak-gflops 1 \
       > "$d.out" 2>&1; then fail "$kind on $sub: the run did not fail"; fi
  grep -q "write_fault_shim: $kind on .*${sub%\$}" "$d.out" || { tail -n 3 "$d.out"; fail "$kind on $sub: the fault never happened"; }
  grep -Eq "$want" "$d.out" || { tail -n 3 "$d.out"; fail "$kind on $sub: the error does not name the file ($want)"; }
  [ "$(checkpoints_kept "$d")" = step_00000004 ] || fail "$kind on $sub: checkpoints: $(ls "$d/checkpoints")"
  (cd "$T/x4" && md5sum $ck4/*) > "$d.md5"
  (cd "$d" && md5sum -c --quiet "$d.md5") || fail "$kind on $sub: the step-4 checkpoint changed"
  "$JTOK" train --config "$T/cfg.json" --out "$d" --resume --peak-gflops 1 > "$d.resume" 2>&1 ||
    { tail -n 3 "$d.resume"; fail "$kind on $sub: --resume failed"; }
  grep -q "resume: from $d/$ck4" "$d.resume" || fail "$kind on $sub: did not resume from step 4"
  step_losses "$d/log.jsonl" | cmp -s - "$T/straight.losses" || fail "$kind on $sub: losses after resume differ from a straight run"
  echo "ok: checkpoint, $kind on $sub: $(grep -m1 -Eo "$want" "$d.out"); resumed, 8 losses = straight run"
  rm -rf "$d" "$d".*
}
ckpt_case short_write step_00000008 "$half" "cannot write .*step_00000008\.tmp/model\.safetensors.*No space left on device"
ckpt_case eio_write optimizer.safetensors 0 "cannot write .*step_00000008\.tmp/optimizer\.safetensors.*Input/output error"
ckpt_case fsync_eio trainer_state.json 0 "cannot fsync .*step_00000008\.tmp/trainer_state\.json.*Input/output error"
ckpt_case rename_fail 'config.json$' 0 "cannot rename .*config\.json.* to .*step_00000008\.tmp/config\.json.*Input/output error"
ckpt_case rename_fail 'step_00000008$' 0 "cannot rename checkpoint .*step_00000008\.tmp to .*step_00000008: Input/output error"
ckpt_case rename_fail 'COMPLETE$' 0 "cannot rename .* to .*step_00000008/COMPLETE: Input/output error"
ckpt_case fsync_eio 'checkpoints$' 0 "cannot fsync directory .*checkpoints: Input/output error"

# Legal short writes: the writer loops; the checkpoint equals the one written without the shim.
d="$T/ck_partial"; cp -a "$T/x4" "$d"
with_fault partial step_00000008 0 "$JTOK" train --config "$T/cfg.json" --out "$d" --resume --peak-gflops 1 > "$d.out" 2>&1 ||
  { tail -n 3 "$d.out"; fail "short writes that succeed failed the run"; }
grep -q "write_fault_shim: partial on" "$d.out" || fail "partial: the shim did not act"
for f in model.safetensors optimizer.safetensors; do
  cmp -s "$d/checkpoints/step_00000008/$f" "$T/straight/checkpoints/step_00000008/$f" || fail "partial: $f differs from a straight run's"
done
echo "ok: checkpoint written 1000 bytes per write() call equals the straight run's"

# export --out (publish_dir_atomic), each fault: fails naming the file, and leaves neither the
# directory nor its temporary one; a failing fsync of the parent after the rename is reported too
# (the copy is there, its rename not known to be durable).
exp_case() {  # N KIND SUBSTR AFTER_BYTES EXPECTED_MESSAGE_REGEX LEFT: exports into $T/exp_N/copy
  local kind=$2 sub=$3 after=$4 want=$5 left=$6 e="$T/exp_$1"
  mkdir -p "$e"
  if with_fault "$kind" "$sub" "$after" "$JTOK" export --checkpoint "$T/straight" --out "$e/copy" > "$e.out" 2>&1; then
    fail "export, $kind: did not fail"
  fi
  grep -q "write_fault_shim: $kind on" "$e.out" || { tail -n 3 "$e.out"; fail "export, $kind: the fault never happened"; }
  grep -Eq "$want" "$e.out" || { tail -n 3 "$e.out"; fail "export, $kind: the error does not say what failed ($want)"; }
  [ "$(ls -A "$e" | tr '\n' ' ')" = "$left" ] || fail "export, $kind: left '$(ls -A "$e" | tr '\n' ' ')', want '$left'"
  echo "ok: export, $kind on $sub: $(grep -m1 -Eo "$want" "$e.out"); left '$left'"
}
exp_case 1 eio_write copy.tmp/model.safetensors 0 "cannot write .*copy\.tmp/model\.safetensors.*Input/output error" ""
exp_case 2 fsync_eio trainer_state.json 0 "cannot fsync .*copy\.tmp/trainer_state\.json.*Input/output error" ""
exp_case 3 fsync_eio 'copy.tmp$' 0 "cannot fsync directory .*copy\.tmp: Input/output error" ""
exp_case 4 rename_fail 'copy$' 0 "cannot rename .*copy\.tmp to .*copy: Input/output error" ""
exp_case 5 fsync_eio "$T/exp_5\$" 0 "cannot fsync directory .*exp_5: Input/output error" "copy "

# prepare, each fault on the first shard: fails naming the shard, leaves no shard and no temp file.
"$JTOK" prepare --tokenizer gpt2 --out "$T/p_ref" --shard-tokens 20000 "$ROOT"/tests/data/corpus/*.md > /dev/null
prep_case() {  # KIND SUBSTR AFTER_BYTES EXPECTED_MESSAGE_REGEX
  local kind=$1 sub=$2 after=$3 want=$4 d="$T/p_$1_$RANDOM"
  if with_fault "$kind" "$sub" "$after" "$JTOK" prepare --tokenizer gpt2 --out "$d" --shard-tokens 20000 "$ROOT"/tests/data/corpus/*.md \
       > "$d.out" 2>&1; then fail "prepare, $kind: did not fail"; fi
  grep -q "write_fault_shim: $kind on" "$d.out" || { tail -n 3 "$d.out"; fail "prepare, $kind: the fault never happened"; }
  grep -Eq "$want" "$d.out" || { tail -n 3 "$d.out"; fail "prepare, $kind: the error does not name the shard ($want)"; }
  [ -z "$(find "$d" -name '*.bin' 2>/dev/null)" ] || fail "prepare, $kind: a shard was left: $(find "$d" -name '*.bin')"
  [ -z "$(find "$d" -name '.*tmp*' 2>/dev/null)" ] || fail "prepare, $kind: a temporary file was left"
  echo "ok: prepare, $kind: $(grep -m1 -Eo "$want" "$d.out"); no shard left"
}
prep_case short_write .bin 10000 "cannot write shard .*\.bin.*No space left on device"
prep_case eio_write .bin 0 "cannot write shard .*\.bin.*Input/output error"
prep_case fsync_eio .bin 0 "cannot fsync shard .*\.bin.*Input/output error"
prep_case rename_fail .bin 0 "shard .*\.bin: cannot rename .*Input/output error"
d="$T/p_partial"
with_fault partial .bin 0 "$JTOK" prepare --tokenizer gpt2 --out "$d" --shard-tokens 20000 "$ROOT"/tests/data/corpus/*.md > "$d.out" 2>&1 ||
  { tail -n 3 "$d.out"; fail "prepare with short writes that succeed failed"; }
grep -q "write_fault_shim: partial on" "$d.out" || fail "prepare, partial: the shim did not act"
(cd "$T/p_ref" && md5sum *.bin) | (cd "$d" && md5sum -c --quiet) || fail "prepare, partial: shards differ"
echo "ok: prepare with 1000 bytes per write() call gives the same shards"
