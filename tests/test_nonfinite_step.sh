#!/usr/bin/env bash
# A non-finite step is never applied and never saved: a NaN injected into one gradient at a
# checkpoint step (test-only hook JTOK_TEST_NAN_GRAD_AT_STEP) stops the run with the step number
# and the tensor,
# writes no checkpoint, logs the error, and leaves the previous checkpoint complete, unchanged and
# resumable, although retention keeps a single checkpoint. (Constant learning rate: the first run
# stops at step 10 with --max-steps, which must not change the schedule of the comparison run.)
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$ROOT/tests/lib/tiny_run.sh"
prepare_tiny_corpus "$T/data"
cat > "$T/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 32, "max_position_embeddings": 16, "jtok": true,
  "seq_len": 16, "micro_batch_size": 2, "max_steps": 20, "lr_scheduler_type": "constant", "checkpoint_interval": 5, "keep_checkpoints": 1,
  "eval_interval": 1000, "eval_batches": 1, "sample_interval": 0,
  "train_data": "$T/data/train", "val_data": "$T/data/val" }
JSON
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }

"$JTOK" train --config "$T/cfg.json" --out "$T/straight" --peak-gflops 1 > /dev/null
"$JTOK" train --config "$T/cfg.json" --out "$T/x" --max-steps 10 --peak-gflops 1 > /dev/null
ck="$T/x/checkpoints/step_00000010"
md5sum "$ck"/* > "$T/before.md5"

if JTOK_TEST_NAN_GRAD_AT_STEP=15 "$JTOK" train --config "$T/cfg.json" --out "$T/x" --resume --peak-gflops 1 \
     > "$T/nan.out" 2>&1; then fail "a NaN gradient did not stop the run"; fi
tail -n 2 "$T/nan.out"
grep -q "step 15: the global gradient norm is nan (first non-finite gradient: model\.[a-z0-9_.]*weight); the step was not applied" \
  "$T/nan.out" || fail "the error does not name the step and the tensor"
grep -q "newest checkpoint: $ck" "$T/nan.out" || fail "the error does not name the last good checkpoint"
[ "$(ls "$T/x/checkpoints")" = step_00000010 ] || fail "checkpoints after the NaN step: $(ls "$T/x/checkpoints")"
md5sum -c --quiet "$T/before.md5" || fail "the previous checkpoint changed"
grep -q '"type":"error","step":15' "$T/x/log.jsonl" || grep -q '"step":15,"type":"error"' "$T/x/log.jsonl" ||
  grep -q '"message":"step 15' "$T/x/log.jsonl" || fail "log.jsonl has no error line for step 15"
echo "ok: the NaN step stopped the run, nothing saved, step 10 intact"

# The previous checkpoint resumes, and the run continues as if the NaN step had never happened.
"$JTOK" train --config "$T/cfg.json" --out "$T/x" --resume --peak-gflops 1 > "$T/resume.out"
grep -q "resume: from $ck" "$T/resume.out" || fail "did not resume from step 10"
step_losses "$T/straight/log.jsonl" > "$T/straight.losses"
step_losses "$T/x/log.jsonl" > "$T/x.losses"
cmp -s "$T/straight.losses" "$T/x.losses" || { diff "$T/straight.losses" "$T/x.losses" | head; fail "losses differ from a straight run"; }
echo "ok: resumed from step 10; all 20 losses equal a straight run bit for bit"

# --skip-nonfinite-steps 1: the NaN batch is dropped, logged, and step 15 retried on the next batch;
# the run finishes its 20 steps and every checkpoint it writes is finite (save_checkpoint checks).
JTOK_TEST_NAN_GRAD_AT_STEP=15 "$JTOK" train --config "$T/cfg.json" --out "$T/skip" --skip-nonfinite-steps 1 \
  --peak-gflops 1 > "$T/skip.out"
grep -q "step 15 skipped (1 of 1 allowed)" "$T/skip.out" || fail "the skipped step was not reported"
grep -q '"type":"skipped_step"' "$T/skip/log.jsonl" || fail "log.jsonl has no skipped_step line"
[ "$(ls "$T/skip/checkpoints")" = step_00000020 ] || fail "after skipping: $(ls "$T/skip/checkpoints")"
step_losses "$T/skip/log.jsonl" > "$T/skip.losses"
[ "$(wc -l < "$T/skip.losses")" = 20 ] || fail "not 20 steps logged"
head -n 14 "$T/skip.losses" | cmp -s - <(head -n 14 "$T/straight.losses") || fail "steps before the skip differ"
echo "ok: --skip-nonfinite-steps dropped the NaN batch and finished"

# A NaN in one row of a token table (test-only hook JTOK_TEST_NAN_TABLE_ROW_AT_STEP: the first
# table's row of the step's first token) makes the loss NaN; the error names the step, the table
# and the row, and nothing is saved.
tbl=$(/usr/bin/python3 -c '
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
rows = [k for k in h if ".jtok.embed." in k]  # JTok tables (model/transformer.cpp), in model order
print(sorted(rows, key=lambda k: int(k.split(".")[2]))[0] if rows else "")' "$T/straight/checkpoints/step_00000020/model.safetensors")
[ -n "$tbl" ] || fail "no token table in the checkpoint"
if JTOK_TEST_NAN_TABLE_ROW_AT_STEP=13 "$JTOK" train --config "$T/cfg.json" --out "$T/row" --peak-gflops 1 > "$T/row.out" 2>&1; then
  fail "a NaN table row did not stop the run"; fi
tail -n 1 "$T/row.out"
grep -Eq "step 13: the loss is nan; the step was not applied \(first non-finite weight: table ${tbl//./\\.} row [0-9]+\)" \
  "$T/row.out" || fail "the error does not name step 13 and the table $tbl"
[ "$(ls "$T/row/checkpoints")" = step_00000010 ] || fail "checkpoints after the NaN row: $(ls "$T/row/checkpoints")"
echo "ok: a NaN in one row of $tbl is reported with the table, the row and step 13"
