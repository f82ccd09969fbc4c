#!/usr/bin/env bash
# JTok-M through the user-facing commands: an MoE + JTok-M run on real text logs its routing
# telemetry (per layer, load fraction per table and mean weight), its aux loss and the hidden-state
# std; its loss falls; eval and generate load the checkpoint; a bad JTok-M config names the field.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
mkdir -p "$T/data"
"$JTOK" prepare --tokenizer gpt2 --out "$T/data/train" "$ROOT"/tests/data/corpus/*.md > /dev/null
"$JTOK" prepare --tokenizer gpt2 --out "$T/data/val" "$ROOT"/tests/reference/README.md > /dev/null
cat > "$T/cfg.json" <<JSON
{ "model_type": "jtok_moe", "vocab_size": 50257, "hidden_size": 32, "num_hidden_layers": 3,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
  "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
  "jtokm": true, "jtokm_n_e": 5, "jtokm_top_k": 2,
  "seq_len": 32, "micro_batch_size": 4, "gradient_accumulation_steps": 2, "max_steps": 30,
  "learning_rate": 3e-3, "min_lr": 3e-4, "warmup_steps": 3, "log_interval": 5,
  "eval_interval": 30, "eval_batches": 2, "checkpoint_interval": 30,
  "train_data": "$T/data/train", "val_data": "$T/data/val" }
JSON
export OMP_NUM_THREADS=2
"$JTOK" train --config "$T/cfg.json" --out "$T/run" --peak-gflops 1 > "$T/train.out"
grep -q "rho 0.400" "$T/train.out" || { echo "FAIL: the start line does not report rho = K/n_e"; cat "$T/train.out"; exit 1; }
/usr/bin/python3 - "$T/run/log.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [l for l in lines if l["type"] == "step"]
routing = [l for l in lines if l["type"] == "routing"]
assert len(steps) == 30, len(steps)
assert all(s["jtokm_aux_loss"] > 0 and s["aux_loss"] > 0 and s["hidden_std"] > 0 for s in steps)
# Balanced routing gives lambda * n_e * sum_i (1/n_e)(1/n_e) = lambda = 1e-4; it cannot be far below.
assert all(0.5e-4 < s["jtokm_aux_loss"] < 5e-4 for s in steps), [s["jtokm_aux_loss"] for s in steps]
assert [r["step"] for r in routing] == [5, 10, 15, 20, 25, 30], [r["step"] for r in routing]
for r in routing:
    assert [l["layer"] for l in r["layers"]] == [0, 1, 2]
    for l in r["layers"]:
        assert len(l["load"]) == 5 and abs(sum(l["load"]) - 1) < 1e-9, l
        assert all(0 <= w <= 1 for w in l["mean_weight"]), l
        # K = 2 of 5: a chosen table's weight is at least... the larger of two normalised sigmoids >= 1/2
        assert max(l["mean_weight"]) >= 0.5 - 1e-9, l
first = sum(s["loss"] for s in steps[:5]) / 5
last = sum(s["loss"] for s in steps[-5:]) / 5
assert last < first - 0.5, (first, last)
print(f"ok: loss {first:.3f} -> {last:.3f}, routing records {len(routing)}")
PY
"$JTOK" eval --checkpoint "$T/run" --val-data "$T/data/val" --val-batches 2 --no-blimp > "$T/eval.out"
grep -q "validation: loss" "$T/eval.out" || { echo "FAIL: eval printed no val_loss"; cat "$T/eval.out"; exit 1; }
"$JTOK" generate --checkpoint "$T/run" --prompt "The model" --max-new-tokens 8 --seed 1 > "$T/gen.out"
[ -s "$T/gen.out" ] || { echo "FAIL: generate printed nothing"; exit 1; }
# Bad JTok-M settings: one clear error naming the field.
if "$JTOK" train --config "$T/cfg.json" --out "$T/bad" --jtokm_top_k 6 > "$T/bad.out" 2>&1; then
  echo "FAIL: top_k > n_e accepted"; exit 1; fi
grep -q "jtokm_top_k (6) exceeds jtokm_n_e (5)" "$T/bad.out" || { echo "FAIL: unclear error"; cat "$T/bad.out"; exit 1; }
echo PASS
