#!/usr/bin/env bash
# Writes that fail (the file size limit RLIMIT_FSIZE stands in for a full disk: write() returns
# EFBIG once a file would grow past it; SIGXFSZ is ignored so the process sees the error) lose
# nothing: a checkpoint that cannot be written stops the run with an error naming the file, leaves
# no checkpoint under its final name, and the previous checkpoint stays complete, unchanged and
# resumable; a shard that cannot be written stops `prepare` naming it, leaving no *.bin behind.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p "$T/data"
"$JTOK" prepare --tokenizer gpt2 --out "$T/data/train" "$ROOT"/docs/*.md > /dev/null
"$JTOK" prepare --tokenizer gpt2 --out "$T/data/val" "$ROOT"/docs/model.md > /dev/null
cat > "$T/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 32, "max_position_embeddings": 16, "jtok": true,
  "seq_len": 16, "micro_batch_size": 2, "max_steps": 8, "checkpoint_interval": 4, "keep_checkpoints": 1,
  "eval_interval": 1000, "eval_batches": 1, "sample_interval": 0,
  "train_data": "$T/data/train", "val_data": "$T/data/val" }
JSON
export OMP_NUM_THREADS=1
"$JTOK" train --config "$T/cfg.json" --out "$T/x" --max-steps 4 --peak-gflops 1 > /dev/null
ck="$T/x/checkpoints/step_00000004"
md5sum "$ck"/* > "$T/before.md5"
size_kb=$(( $(stat -c %s "$ck/model.safetensors") / 1024 ))

# The next checkpoint (step 8) cannot be written: the limit is half of model.safetensors.
if ( trap '' XFSZ; ulimit -f $((size_kb / 2)); exec "$JTOK" train --config "$T/cfg.json" --out "$T/x" --resume \
       --peak-gflops 1 ) > "$T/full.out" 2>&1; then fail "a failed checkpoint write did not fail the run"; fi
tail -n 1 "$T/full.out"
grep -q "cannot write .*model.safetensors.*File too large" "$T/full.out" || fail "the error does not name the file"
[ "$(ls "$T/x/checkpoints" | grep -v '\.tmp$')" = step_00000004 ] || fail "checkpoints after the failure: $(ls "$T/x/checkpoints")"
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
       "$ROOT"/docs/*.md ) > "$T/prep.out" 2>&1; then fail "a failed shard write did not fail prepare"; fi
tail -n 1 "$T/prep.out"
grep -q "shard .*\.bin" "$T/prep.out" || fail "the error does not name the shard"
[ -z "$(find "$T/p" -name '*.bin' 2>/dev/null)" ] || fail "a shard was left: $(find "$T/p" -name '*.bin')"
[ -z "$(find "$T/p" -name '.*tmp*' 2>/dev/null)" ] || fail "a temporary file was left"
echo "ok: a shard write that fails leaves no shard"
