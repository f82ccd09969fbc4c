#!/usr/bin/env bash
# `jtok train --device cuda` on a GPU host (issue 39; run by scripts/test_cuda.sh): a small JTok +
# JTok-M model on real token shards, 20 steps, checkpoints at 10 and 20.
# - two GPU runs give the same final checkpoint (model + optimizer files) bit for bit;
# - a GPU run killed after its step-10 checkpoint and resumed on the GPU gives that checkpoint too;
# - a run with the table work on side streams (table_streams true) gives that checkpoint too;
# - the GPU's fp32 losses follow the CPU engine's, every step within a relative 2e-3 (printed);
# - a GPU checkpoint resumes on the CPU and a CPU one on the GPU, each finishing within 2e-3 of the
#   loss of the run that stayed on one device;
# - bf16 on the GPU trains, its losses within 5e-2 of fp32's (printed);
# - --train-only tables (a frozen backbone) follows the CPU's losses within 2e-3;
# - a NaN gradient stops the run naming the step, with nothing saved after it.
# Needs JTOK_BIN, JTOK_GPU_SHARDS (token shards, GPT-2 ids: scripts/gpu_prepare.sh's shards/) and
# JTOK_GPU_TOKENIZER (the gpt2 tokenizer's files, its tokenizer/). JTOK_TRAIN_DEVICE=loopback runs
# it all with the CPU engine as the device (tests/test_train_cuda_script.sh, in CI).
set -euo pipefail
JTOK=${JTOK_BIN:?} DATA=${JTOK_GPU_SHARDS:?} TOK=${JTOK_GPU_TOKENIZER:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# JTOK_TRAIN_CUDA_SHAPE="d seq micro" shrinks the model and the batch (the CI run on the CPU engine,
# where every run's tables and checkpoints cost seconds); the GPU runs the default.
read -r D SEQ MICRO <<< "${JTOK_TRAIN_CUDA_SHAPE:-128 64 4}"
cat > "$T/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": $D, "num_hidden_layers": 2, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": $((2 * D)), "max_position_embeddings": 128, "qk_norm": true,
  "seq_len": $SEQ, "micro_batch_size": $MICRO, "gradient_accumulation_steps": 2, "max_steps": 20,
  "learning_rate": 3e-3, "min_lr": 3e-4, "warmup_steps": 4, "jtok": true, "jtok_layers": "1",
  "jtokm": true, "jtokm_layers": "0,1", "jtokm_n_e": 3, "jtokm_top_k": 2, "max_grad_norm": 1.0,
  "eval_interval": 10, "eval_batches": 2, "checkpoint_interval": 10, "keep_checkpoints": 3,
  "sample_interval": 20, "train_data": "$DATA", "val_data": "$DATA", "tokenizer_dir": "$TOK" }
JSON
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
DEV=${JTOK_TRAIN_DEVICE:-cuda}
train() { "$JTOK" train --config "$T/cfg.json" "$@"; }
ck() { echo "$1/checkpoints/step_000000$2"; }
hash_of() { cat "$1/model.safetensors" "$1/optimizer.safetensors" | sha256sum | cut -c1-16; }
# step -> loss (float.hex) of a run's log
losses() { /usr/bin/env python3 -c '
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("type") == "step": print(j["step"], j["loss"])' "$1"; }
# The largest relative difference between two runs' losses over their common steps, checked < $3.
compare() { /usr/bin/env python3 - "$1" "$2" "$3" "$4" <<'PY'
import json, sys
def steps(p):
    return {j["step"]: j["loss"] for j in map(json.loads, open(p)) if j.get("type") == "step"}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
common = sorted(set(a) & set(b))
worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in common)
print(f"{sys.argv[4]}: {len(common)} steps, max relative loss difference {worst:.2e} (bound {sys.argv[3]}); "
      f"last {a[common[-1]]:.5f} vs {b[common[-1]]:.5f}")
sys.exit(0 if worst < float(sys.argv[3]) and len(common) >= 10 else 1)
PY
}
kill_after_step_10() {  # out, device: killed (SIGKILL, by itself) right after its step-10 checkpoint
  if JTOK_TEST_KILL_AFTER_CHECKPOINT=10 train --out "$1" --device "$2" > "$1.out" 2>&1; then
    fail "$2 run was not killed after step 10"
  fi
  [ -f "$(ck "$1" 10)/COMPLETE" ] && [ ! -e "$(ck "$1" 20)" ] || fail "$2 run killed after step 10: $(ls "$1/checkpoints")"
}

train --out "$T/a" --device "$DEV" > "$T/a.out" || { tail -20 "$T/a.out"; fail "the GPU run failed"; }
grep -m1 '^device:' "$T/a.out"
grep 'step 20/20' "$T/a.out" | tail -1
train --out "$T/b" --device "$DEV" > "$T/b.out"
[ "$(hash_of "$(ck "$T/a" 20)")" = "$(hash_of "$(ck "$T/b" 20)")" ] || fail "two GPU runs ended at different checkpoints"
echo "ok: two GPU runs of 20 steps: the same checkpoint ($(hash_of "$(ck "$T/a" 20)"))"

kill_after_step_10 "$T/k" "$DEV"
train --out "$T/k" --resume --device "$DEV" > "$T/k.resumed"
[ "$(hash_of "$(ck "$T/k" 20)")" = "$(hash_of "$(ck "$T/a" 20)")" ] || fail "killed at step 10 and resumed: another checkpoint"
echo "ok: killed after step 10 and resumed on the GPU: the same checkpoint"

train --out "$T/s" --device "$DEV" --set table_streams=true > "$T/s.out"
[ "$(hash_of "$(ck "$T/s" 20)")" = "$(hash_of "$(ck "$T/a" 20)")" ] || fail "table_streams true: another checkpoint"
echo "ok: the table work on side streams (table_streams true): the same checkpoint"

train --out "$T/cpu" --device cpu > "$T/cpu.out"
compare "$T/a/log.jsonl" "$T/cpu/log.jsonl" 2e-3 "GPU fp32 vs CPU fp32"

kill_after_step_10 "$T/g2c" "$DEV"
train --out "$T/g2c" --resume --device cpu > "$T/g2c.resumed"
compare "$T/g2c/log.jsonl" "$T/a/log.jsonl" 2e-3 "GPU checkpoint resumed on the CPU vs GPU throughout"
kill_after_step_10 "$T/c2g" cpu
train --out "$T/c2g" --resume --device "$DEV" > "$T/c2g.resumed"
compare "$T/c2g/log.jsonl" "$T/cpu/log.jsonl" 2e-3 "CPU checkpoint resumed on the GPU vs CPU throughout"

train --out "$T/bf16" --device "$DEV" --set precision=bf16 > "$T/bf16.out" || { tail -20 "$T/bf16.out"; fail "bf16 run"; }
compare "$T/bf16/log.jsonl" "$T/a/log.jsonl" 5e-2 "GPU bf16 vs GPU fp32"

train --out "$T/frozen_gpu" --device "$DEV" --train-only tables > "$T/frozen_gpu.out"
train --out "$T/frozen_cpu" --device cpu --train-only tables > "$T/frozen_cpu.out"
compare "$T/frozen_gpu/log.jsonl" "$T/frozen_cpu/log.jsonl" 2e-3 "--train-only tables: GPU vs CPU"

if JTOK_TEST_NAN_GRAD_AT_STEP=5 train --out "$T/nan" --device "$DEV" > "$T/nan.out" 2>&1; then
  fail "a NaN gradient on the GPU did not stop the run"
fi
grep -q "step 5: .*gradient norm is nan" "$T/nan.out" || fail "unclear refusal: $(tail -3 "$T/nan.out")"
[ ! -e "$(ck "$T/nan" 10)" ] || fail "a checkpoint was saved after the refused step"
echo "ok: $(grep -o 'step 5: [^;]*' "$T/nan.out" | head -1)"
echo "train_cuda: ok"
