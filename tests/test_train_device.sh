#!/usr/bin/env bash
# The GPU trainer's path (`train --device cuda`: train/tables_cuda.h) checked on every machine with
# `--device loopback`, the same path with the CPU engine as its device: the placement, the steps,
# validation, samples, checkpoints written back from the device, resume and the non-finite refusal.
# - loopback and cpu runs give bitwise-equal step losses, hidden-state spreads, validation losses,
#   JTok-M routing lines and final checkpoints (model and optimizer files);
# - a loopback run killed after a checkpoint resumes on the cpu, and a cpu one on loopback, to the
#   same final checkpoint: a checkpoint means the same thing on either device;
# - table_dedup false (a GPU-only benchmark mode) is refused on cpu and loopback, naming the field;
# - a NaN gradient on the device path stops the run naming the step, nothing saved after it.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
source "$ROOT/tests/lib/tiny_run.sh"
prepare_tiny_corpus "$T/data" "$ROOT"/tests/reference/README.md
cat > "$T/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
  "seq_len": 32, "micro_batch_size": 4, "gradient_accumulation_steps": 2, "max_steps": 12,
  "learning_rate": 3e-3, "min_lr": 3e-4, "warmup_steps": 3, "jtok": true, "jtok_layers": "1",
  "jtokm": true, "jtokm_layers": "0", "jtokm_n_e": 3, "jtokm_top_k": 2, "max_grad_norm": 0.5,
  "eval_interval": 6, "eval_batches": 2, "checkpoint_interval": 6, "keep_checkpoints": 3,
  "sample_interval": 12, "train_data": "$T/data/train", "val_data": "$T/data/val" }
JSON
export OMP_NUM_THREADS=2
# Each step's loss and hidden-state spread, each validation loss, exactly (float.hex), and JTok-M's
# routing lines (per layer and table: load fraction, mean weight).
losses() { /usr/bin/python3 -c '
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("type") == "step":
        print("step", j["step"], j["loss"].hex(), "hidden_std", j["hidden_std"].hex())
    elif j.get("type") == "val":
        print("val", j["step"], j["val_loss"].hex())
    elif j.get("type") == "routing":
        print("routing", j["step"], json.dumps(j["layers"], sort_keys=True))' "$1"; }
final_hash() { cat "$1/checkpoints/step_00000012/model.safetensors" "$1/checkpoints/step_00000012/optimizer.safetensors" | sha256sum | cut -c1-16; }
train() { "$JTOK" train --config "$T/cfg.json" --peak-gflops 1 "$@"; }

train --out "$T/cpu" > "$T/cpu.out"
train --out "$T/loop" --device loopback > "$T/loop.out"
grep -q "device: loopback" "$T/loop.out" || fail "the loopback run did not take the device path: $(head -5 "$T/loop.out")"
grep -q "sample step 12" "$T/loop.out" || fail "no sample from the device path"
losses "$T/cpu/log.jsonl" > "$T/cpu.losses"
losses "$T/loop/log.jsonl" > "$T/loop.losses"
[ "$(grep -c '^step' "$T/cpu.losses")" = 12 ] && [ "$(grep -c '^val' "$T/cpu.losses")" = 2 ] &&
  [ "$(grep -c '^routing' "$T/cpu.losses")" -ge 1 ] || fail "cpu run: $(cat "$T/cpu.losses")"
cmp -s "$T/cpu.losses" "$T/loop.losses" || { diff "$T/cpu.losses" "$T/loop.losses" | head; fail "losses differ, cpu vs loopback"; }
[ "$(final_hash "$T/cpu")" = "$(final_hash "$T/loop")" ] || fail "final checkpoints differ, cpu vs loopback"
echo "ok: 12 step losses and hidden-state spreads, 2 validations, the routing lines and the final checkpoint equal, cpu and loopback ($(final_hash "$T/cpu"))"

# Killed (SIGKILL, by itself: JTOK_TEST_KILL_AFTER_CHECKPOINT) right after its step-6 checkpoint on
# one device, resumed on the other.
kill_after_first_checkpoint() {  # out, device
  if JTOK_TEST_KILL_AFTER_CHECKPOINT=6 train --out "$1" --device "$2" > "$1.out" 2>&1; then
    fail "$2 run was not killed after step 6"
  fi
  [ -f "$1/checkpoints/step_00000006/COMPLETE" ] && [ ! -e "$1/checkpoints/step_00000012" ] ||
    fail "$2 run killed after step 6: $(ls "$1/checkpoints")"
}
for pair in "loopback cpu" "cpu loopback"; do
  set -- $pair
  out="$T/from_$1"
  kill_after_first_checkpoint "$out" "$1"
  train --out "$out" --resume --device "$2" > "$out.resumed"
  grep -q "resume: from" "$out.resumed" || fail "$1 -> $2: did not resume: $(tail -3 "$out.resumed")"
  [ "$(final_hash "$out")" = "$(final_hash "$T/cpu")" ] || fail "killed on $1, resumed on $2: final checkpoint differs"
  echo "ok: killed on $1 after $(ls "$out/checkpoints" | head -1), resumed on $2: the same final checkpoint"
done

# `jtok parity` through the device path: the same losses, norms and final weights as on the CPU.
PYTHONPATH="$ROOT/tests/reference" /usr/bin/python3 - "$T/batch.safetensors" <<'PY'
import sys
import numpy as np
import safetensors_np
rng = np.random.default_rng(7)
ids = rng.integers(0, 50257, size=(3, 2, 4, 33), dtype=np.int32)  # (S, M, B, T + 1)
safetensors_np.save(sys.argv[1], {"input_ids": np.ascontiguousarray(ids[..., :-1]), "labels": np.ascontiguousarray(ids[..., 1:])})
PY
for dev in cpu loopback; do
  "$JTOK" parity --config "$T/cfg.json" --weights "$T/cpu/checkpoints/step_00000006/model.safetensors" \
    --batch "$T/batch.safetensors" --steps 4 --device "$dev" --out "$T/parity_$dev.safetensors" > "$T/parity_$dev.out"
done
PYTHONPATH="$ROOT/tests/reference" /usr/bin/python3 - "$T/parity_cpu.safetensors" "$T/parity_loopback.safetensors" <<'PY' || fail "parity differs"
import sys
import numpy as np
import safetensors_np
cpu, dev = safetensors_np.load(sys.argv[1]), safetensors_np.load(sys.argv[2])
assert not any(k.startswith("grad.") for k in dev), "the device path wrote grad.* tensors"
keys = [k for k in cpu if not k.startswith("grad.")]
assert sorted(keys) == sorted(dev), (sorted(set(keys) ^ set(dev)))[:5]
bad = [k for k in keys if not np.array_equal(cpu[k], dev[k])]
assert not bad, f"differ: {bad[:5]}"
print(f"ok: jtok parity --device loopback equals --device cpu: {len(keys)} tensors (losses {cpu['loss'].tolist()})")
PY

# table_optimizer dense-eager (every row stepped every step) ends where the deferred dense one does.
train --out "$T/eager" --set table_optimizer=dense-eager > "$T/eager.out"
[ "$(final_hash "$T/eager")" = "$(final_hash "$T/cpu")" ] || fail "dense-eager and dense (deferred) differ"
echo "ok: table_optimizer dense-eager gives the deferred optimizer's final checkpoint"

# --train-only tables (a frozen backbone) through the device path: the same final checkpoint.
for dev in cpu loopback; do
  train --out "$T/frozen_$dev" --device "$dev" --train-only tables --max-steps 4 --set checkpoint_interval=4 > "$T/frozen_$dev.out"
done
frozen_hash() { cat "$1/checkpoints/step_00000004/model.safetensors" "$1/checkpoints/step_00000004/optimizer.safetensors" | sha256sum | cut -c1-16; }
[ "$(frozen_hash "$T/frozen_cpu")" = "$(frozen_hash "$T/frozen_loopback")" ] || fail "--train-only tables: cpu and loopback differ"
echo "ok: --train-only tables, 4 steps: the same checkpoint on cpu and loopback"

# table_dedup false (the naive per-position gather and scatter) is the GPU's alone: refused on the
# CPU engine and on loopback, naming the field, before any step.
for dev in cpu loopback; do
  if train --out "$T/nodedup_$dev" --device "$dev" --set table_dedup=false > "$T/nodedup_$dev.out" 2>&1; then
    fail "--device $dev ran with table_dedup false"
  fi
  grep -q "table_dedup false .* runs with --device cuda only, not with --device $dev" "$T/nodedup_$dev.out" ||
    fail "unclear refusal of table_dedup false on $dev: $(tail -3 "$T/nodedup_$dev.out")"
  ! grep -q '"type": *"step"' "$T/nodedup_$dev/log.jsonl" 2>/dev/null || fail "$dev took a step with table_dedup false"
done
echo "ok: table_dedup false refused on cpu and loopback: $(tail -1 "$T/nodedup_cpu.out")"

# The non-finite policy on the device path.
if JTOK_TEST_NAN_GRAD_AT_STEP=8 train --out "$T/nan" --device loopback > "$T/nan.out" 2>&1; then
  fail "a NaN gradient on the device path did not stop the run"
fi
grep -q "step 8: the global gradient norm is nan" "$T/nan.out" || fail "unclear refusal: $(tail -3 "$T/nan.out")"
[ ! -e "$T/nan/checkpoints/step_00000012" ] || fail "a checkpoint was saved after the refused step"
echo "ok: $(grep -o 'step 8: the global gradient norm is nan[^;]*' "$T/nan.out" | head -1)"
echo "test_train_device: ok"
