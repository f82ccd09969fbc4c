#!/usr/bin/env bash
# Issue 21: `jtok train --precision bf16` (matrix products in bf16, fp32 accumulation) for 50 steps
# on a tiny JTok + JTok-M model stays within a loss band of the fp32 run: the final training loss
# and the validation loss each within 0.05. Measured: 3e-4 / 2e-4 in the release build, 1.3e-3 /
# 2.1e-2 in the sanitizer build (-O1: other fp32 summation orders, so another trajectory); bf16's
# rounding moves each product by ~0.2 %, and 50 steps at lr 3e-3 on a tiny corpus amplify that
# differently from build to build, so the band is what the runs showed with a 2.5x margin. On a CPU with AVX-512 BF16 the start line of the log says
# bf16 ran (and the losses are not bit-identical to fp32's); on one without, it says fp32 ran and the
# run printed why, and the losses are bit-identical.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
PY=/usr/bin/python3
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=1
source "$ROOT/tests/lib/tiny_run.sh"
prepare_tiny_corpus "$T/data"
cat > "$T/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 64, "tie_word_embeddings": true,
  "seq_len": 32, "micro_batch_size": 4, "max_steps": 50, "learning_rate": 3e-3, "min_lr": 3e-4,
  "warmup_steps": 4, "jtok": true, "jtokm": true, "jtokm_layers": "1", "jtokm_n_e": 3, "jtokm_top_k": 2,
  "eval_interval": 50, "eval_batches": 2, "checkpoint_interval": 50, "keep_checkpoints": 1,
  "sample_interval": 0, "train_data": "$T/data/train", "val_data": "$T/data/val" }
JSON
for p in fp32 bf16; do
  "$JTOK" train --config "$T/cfg.json" --out "$T/run_$p" --precision "$p" --peak-gflops 1 > "$T/out_$p.txt"
done
"$PY" - "$T" <<'PY'
import json, sys
t = sys.argv[1]
def run(p):
    rows = [json.loads(l) for l in open(f"{t}/run_{p}/log.jsonl")]
    start = next(r for r in rows if r.get("type") == "start")
    steps = [r["loss"] for r in rows if r.get("type") == "step"]
    val = [r["val_loss"] for r in rows if r.get("type") == "val"]
    return start["precision"], steps, val[-1]
p32, s32, v32 = run("fp32")
p16, s16, v16 = run("bf16")
out16 = open(f"{t}/out_bf16.txt").read()
assert p32["used"] == "fp32", p32
print(f"fp32: final loss {s32[-1]:.5f}, val {v32:.5f}; bf16 ({p16['used']} ran): final loss {s16[-1]:.5f}, val {v16:.5f}")
assert len(s32) == len(s16) == 50
if p16["used"] == "bf16":
    assert "precision bf16: matrix products in bf16" in out16, out16
    assert s16 != s32, "bf16 run identical to fp32: bf16 did not run"
else:
    assert "no AVX-512 BF16" in out16, out16
    assert s16 == s32, "fallback differs from fp32"
assert abs(s16[-1] - s32[-1]) < 0.05, (s16[-1], s32[-1])
assert abs(v16 - v32) < 0.05, (v16, v32)
PY
echo PASS
