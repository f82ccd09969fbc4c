#!/usr/bin/env bash
# A run never deletes or overwrites a checkpoint it did not write (issue: a fresh run into an old
# run's directory deleted the new run's checkpoints, replaced the old run's step 20, and left eval /
# --resume on the old run's step 30). Replays that sequence: the fresh run must refuse with one line
# naming the directory and its newest step, leave every old file as it was; --overwrite removes the
# old run explicitly; a second trainer on a directory in use is refused.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'kill $bg 2>/dev/null || true; rm -rf "$T"' EXIT
bg=""
source "$ROOT/tests/lib/tiny_run.sh"
prepare_tiny_corpus "$T/data"
cat > "$T/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 32, "max_position_embeddings": 16,
  "seq_len": 16, "micro_batch_size": 2, "max_steps": 30, "eval_interval": 1000, "eval_batches": 1,
  "sample_interval": 0, "train_data": "$T/data/train", "val_data": "$T/data/val" }
JSON
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
snapshot() { (cd "$T/x" && find checkpoints log.jsonl -type f | sort | xargs md5sum); }

"$JTOK" train --config "$T/cfg.json" --out "$T/x" --max-steps 30 --checkpoint_interval 10 --keep_checkpoints 3 \
  --peak-gflops 1 > "$T/first.out"
[ "$(ls "$T/x/checkpoints")" = "$(printf 'step_00000010\nstep_00000020\nstep_00000030')" ] || fail "first run: $(ls "$T/x/checkpoints")"
snapshot > "$T/before.md5"

# The fresh run into the same directory: refused, nothing touched.
if "$JTOK" train --config "$T/cfg.json" --out "$T/x" --max-steps 20 --checkpoint_interval 5 --peak-gflops 1 \
     > "$T/second.out" 2>&1; then fail "a fresh run into an old run's directory was accepted"; fi
cat "$T/second.out"
grep -q "$T/x already holds a run (checkpoints up to step_00000030)" "$T/second.out" || fail "the refusal does not name the directory and step"
grep -q -- "--resume" "$T/second.out" && grep -q -- "--overwrite" "$T/second.out" || fail "the refusal does not say what to do"
snapshot > "$T/after.md5"
cmp -s "$T/before.md5" "$T/after.md5" || { diff "$T/before.md5" "$T/after.md5"; fail "the refused run changed files"; }
"$JTOK" eval --checkpoint "$T/x" --no-blimp --json --val-batches 1 | grep -q '"checkpoint":"[^"]*step_00000030"' ||
  fail "eval does not pick the first run's step 30"
echo "ok: a fresh run into an old run's directory is refused and changes nothing"

# A log alone (a run stopped before its first checkpoint) is an old run too.
mkdir -p "$T/y"; echo '{"type":"start"}' > "$T/y/log.jsonl"
if "$JTOK" train --config "$T/cfg.json" --out "$T/y" --max-steps 2 --peak-gflops 1 > "$T/y.out" 2>&1; then
  fail "a directory with a log was taken"; fi
grep -q "already holds a run (a log.jsonl)" "$T/y.out" || fail "unclear refusal: $(cat "$T/y.out")"
echo "ok: a directory with only a log is refused"

# --overwrite: the old run is removed, explicitly, and the new run's checkpoints all survive.
"$JTOK" train --config "$T/cfg.json" --out "$T/x" --max-steps 20 --checkpoint_interval 5 --keep_checkpoints 3 \
  --overwrite --peak-gflops 1 > "$T/over.out"
grep -q "overwrite: removed 3 checkpoint directories (newest step_00000030) and its log.jsonl of the previous run in $T/x" \
  "$T/over.out" || fail "--overwrite did not say what it removed: $(grep overwrite "$T/over.out")"
[ "$(ls "$T/x/checkpoints")" = "$(printf 'step_00000010\nstep_00000015\nstep_00000020')" ] || fail "after --overwrite: $(ls "$T/x/checkpoints")"
[ "$(grep -c '"type":"start"' "$T/x/log.jsonl")" = 1 ] || fail "the log holds more than the new run"
[ "$(grep -c '"type":"step"' "$T/x/log.jsonl")" = 20 ] || fail "the log does not hold exactly the new run's 20 steps"
id=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['run_id'])" "$T/x/checkpoints/step_00000020/trainer_state.json")
grep -q "\"run_id\":\"$id\"" "$T/x/log.jsonl" || fail "the checkpoint's run id $id is not the log's"
echo "ok: --overwrite removes the old run and says so; the new run keeps its own checkpoints"

# --resume continues the same run (its id), and its retention deletes its own oldest.
"$JTOK" train --config "$T/cfg.json" --out "$T/x" --max-steps 25 --checkpoint_interval 5 --keep_checkpoints 3 \
  --resume --peak-gflops 1 > "$T/resume.out"
[ "$(ls "$T/x/checkpoints")" = "$(printf 'step_00000015\nstep_00000020\nstep_00000025')" ] || fail "after resume: $(ls "$T/x/checkpoints")"
grep -q "\"run_id\": \"$id\"" "$T/x/checkpoints/step_00000025/trainer_state.json" || fail "resume changed the run id"
echo "ok: --resume keeps the run id; retention deletes only that run's oldest"

# A directory in use by another trainer is refused.
"$JTOK" train --config "$T/cfg.json" --out "$T/z" --max-steps 100000 --checkpoint_interval 100000 --peak-gflops 1 \
  > "$T/z.out" 2>&1 &
bg=$!
for _ in $(seq 200); do grep -q '"type":"step"' "$T/z/log.jsonl" 2>/dev/null && break; sleep 0.05; done
if "$JTOK" train --config "$T/cfg.json" --out "$T/z" --resume --max-steps 2 --peak-gflops 1 > "$T/z2.out" 2>&1; then
  fail "a second trainer on a directory in use was accepted"; fi
grep -q "in use by another jtok train" "$T/z2.out" || fail "unclear error: $(cat "$T/z2.out")"
kill "$bg"; wait "$bg" 2>/dev/null || true; bg=""
echo "ok: a directory in use is refused"
