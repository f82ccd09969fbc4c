#!/usr/bin/env bash
# Exact resume: N steps straight, versus the same run killed with SIGKILL at a random moment after
# its first checkpoint and resumed with --resume, give bitwise-identical losses at every step.
# Also: a run killed while writing a checkpoint leaves the previous one complete and loadable.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
# A small corpus of our own: the repository's docs, one document per file.
source "$ROOT/tests/lib/tiny_run.sh"
prepare_tiny_corpus "$T/data" "$ROOT"/tests/reference/README.md
cat > "$T/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
  "seq_len": 32, "micro_batch_size": 4, "gradient_accumulation_steps": 2, "max_steps": 24,
  "learning_rate": 3e-3, "min_lr": 3e-4, "warmup_steps": 4, "jtok": true, "jtok_layers": "1",
  "jtokm": true, "jtokm_layers": "0", "jtokm_n_e": 3, "jtokm_top_k": 2,
  "eval_interval": 8, "eval_batches": 2, "checkpoint_interval": 6, "keep_checkpoints": 2,
  "sample_interval": 12, "train_data": "$T/data/train", "val_data": "$T/data/val" }
JSON
export OMP_NUM_THREADS=2
losses() { /usr/bin/python3 -c '
import json, sys
d = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("type") == "step": d[j["step"]] = j["loss"].hex() if isinstance(j["loss"], float) else j["loss"]
for k in sorted(d): print(k, d[k])' "$1"; }

"$JTOK" train --config "$T/cfg.json" --out "$T/straight" --peak-gflops 1 > "$T/straight.out"
losses "$T/straight/log.jsonl" > "$T/straight.losses"
[ "$(wc -l < "$T/straight.losses")" = 24 ] || { echo "FAIL: straight run logged $(wc -l < "$T/straight.losses") steps"; exit 1; }

# Kill at a random moment after the first checkpoint (step 6), then resume; repeat while it is
# not done, so some kills may land mid-checkpoint too.
"$JTOK" train --config "$T/cfg.json" --out "$T/killed" --peak-gflops 1 > "$T/killed.out" 2>&1 &
pid=$!
while [ ! -f "$T/killed/checkpoints/step_00000006/COMPLETE" ]; do
  kill -0 $pid 2>/dev/null || { echo "FAIL: run ended before its first checkpoint"; cat "$T/killed.out"; exit 1; }
  sleep 0.05
done
sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
kill -9 $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
echo "killed after: $(ls "$T/killed/checkpoints" | tr '\n' ' ')"
"$JTOK" train --config "$T/cfg.json" --out "$T/killed" --resume --peak-gflops 1 > "$T/resumed.out"
grep -q "resume: from" "$T/resumed.out" || { echo "FAIL: did not resume"; cat "$T/resumed.out"; exit 1; }
losses "$T/killed/log.jsonl" > "$T/killed.losses"
if ! cmp -s "$T/straight.losses" "$T/killed.losses"; then
  echo "FAIL: losses differ after kill + resume"; diff "$T/straight.losses" "$T/killed.losses" | head; exit 1
fi
echo "ok: 24 step losses bitwise identical after SIGKILL + --resume"

# A kill while writing a checkpoint: simulate the state it leaves (a .tmp directory, and a
# renamed directory without its COMPLETE marker); the previous checkpoint stays the newest.
ck="$T/killed/checkpoints"
last=$(ls "$ck" | tail -n1)
mkdir -p "$ck/step_00000099.tmp" "$ck/step_00000098"; echo partial > "$ck/step_00000099.tmp/model.safetensors"
cp "$ck/$last/model.safetensors" "$ck/step_00000098/"; head -c 100 "$ck/$last/optimizer.safetensors" > "$ck/step_00000098/optimizer.safetensors"
"$JTOK" eval --checkpoint "$T/killed" --no-blimp --json --val-batches 1 > "$T/eval.json"
grep -q "\"checkpoint\":\"$ck/$last\"" "$T/eval.json" || { echo "FAIL: eval did not pick $last"; cat "$T/eval.json"; exit 1; }
echo "ok: interrupted checkpoint writes are ignored; $last loads"
# A corrupt checkpoint gives a clear error and a non-zero exit.
if "$JTOK" eval --checkpoint "$ck/step_00000098" --no-blimp > "$T/err.out" 2>&1; then echo "FAIL: incomplete checkpoint loaded"; exit 1; fi
grep -q "incomplete" "$T/err.out" || { echo "FAIL: unclear error:"; cat "$T/err.out"; exit 1; }
echo "ok: $(cat "$T/err.out")"
