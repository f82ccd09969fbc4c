#!/usr/bin/env bash
# The memory plan against a real training run: `jtok flops` predicts the RSS of `jtok train` on
# configs/qwen3_0.6b.json (Qwen3-0.6B's shape, random weights: a run from its fresh init) with JTok
# on a few layers, seq 64, micro-batch 1, 2 steps; `/usr/bin/time -v` measures the run's peak RSS.
# Prints predicted, measured and measured / predicted.
#   bash bench/memory_predict.sh [--jtok-layers 0,27] [--train-only tables|all] [--checkpoint]
#                                                                   (from the repository root)
# Without --checkpoint the run writes no checkpoint (--no-checkpoints) and the plan's "while
# training" figure is the prediction; with it the run writes its final checkpoint and the plan's
# peak (+ the checkpoint write's copies) is. Defaults need ~8.1 GiB (train_only tables, 2 table
# layers); --train-only all or --checkpoint need twice that: mind what else the machine runs.
set -euo pipefail
source bench/bench_lib.sh
LAYERS=0,27 ONLY=tables CKPT=0
while [ $# -gt 0 ]; do
  case $1 in
    --jtok-layers) LAYERS=$2; shift 2 ;;
    --train-only) ONLY=$2; shift 2 ;;
    --checkpoint) CKPT=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/jtok_mem_predict.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# A little Qwen3-tokenized text (the config's tokenizer): the run only needs a few batches of 64.
"$JTOK" prepare --tokenizer qwen3 --out "$WORK/data/train" tests/data/corpus/*.md > /dev/null
"$JTOK" prepare --tokenizer qwen3 --out "$WORK/data/val" tests/data/corpus/model.md > /dev/null
SETS=(--set jtok=true --set "jtok_layers=$LAYERS" --set "train_only=$ONLY" --set seq_len=64 --set micro_batch_size=1
      --set gradient_accumulation_steps=1 --set max_steps=2 --set eval_batches=1 --set eval_interval=2
      --set checkpoint_interval=2 --set sample_interval=0 --set log_interval=1
      --set "train_data=$WORK/data/train" --set "val_data=$WORK/data/val")
"$JTOK" flops --config configs/qwen3_0.6b.json "${SETS[@]}" --json > "$WORK/flops.json"
CK=(--no-checkpoints); [ $CKPT = 1 ] && CK=()
# --no-memory-check: train checks the plan with the checkpoint write even under --no-checkpoints.
/usr/bin/time -v "$JTOK" train --config configs/qwen3_0.6b.json "${SETS[@]}" --out "$WORK/run" --peak-gflops 1 --no-memory-check \
  "${CK[@]}" > "$WORK/train.out" 2> "$WORK/time.txt" || { cat "$WORK/train.out" >&2; head -n 3 "$WORK/time.txt" >&2; exit 1; }
grep -E "^params:|^memory plan|^  (weights|token|AdamW|gradients|activations|=|\+)" "$WORK/train.out"
$PY - "$WORK/flops.json" "$WORK/time.txt" "$CKPT" "$LAYERS" "$ONLY" <<'PY'
import json, re, sys
flops, timef, ckpt, layers, only = sys.argv[1:]
plan = json.load(open(flops))["memory_bytes"]["plan"]
pred = plan["total"] if ckpt == "1" else plan["steady"]
rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(timef).read()).group(1)) * 1024
gib = 1024 ** 3
what = "peak with the checkpoint write" if ckpt == "1" else "while training (no checkpoint written)"
print(f"memory_predict: qwen3_0.6b, JTok on layers {layers}, train_only {only}, seq 64, micro-batch 1, 2 steps")
print(f"  predicted ({what}): {pred / gib:.3f} GiB | measured peak RSS: {rss / gib:.3f} GiB | "
      f"measured / predicted = {rss / pred:.3f}")
PY
