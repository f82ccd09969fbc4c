#!/usr/bin/env bash
# Serving throughput of `jtok serve`: prefill and decode tokens/s at 1 and 16 concurrent sequences
# for the baseline, +JTok and +JTok-M, with the token tables in RAM, memory-mapped with a warm page
# cache, memory-mapped cold (the checkpoint file evicted with posix_fadvise DONTNEED before the
# server starts), and cold without the row prefetch (--no-prefetch), with the resident memory and
# the major page faults of each server after its runs. One run, one table.
#
#   bench/serve_throughput.sh [--config FILE] [--new-tokens N] [--prompt-tokens P] [--threads N]
#                             [--concurrency "1 16"]
#
# Each variant is a throwaway checkpoint (1 training step of --config, default a d=256, 6-layer
# model below; random-ish weights are fine for speed) on data/train + data/val:
#   base    the config as is
#   +JTok   jtok on every layer
#   +JTok-M jtokm on layers 1,3,5 (n_e 4, top-K 2), as the config's layers allow
# Client: bench/serve_client.mjs (node; streamed greedy completions with ignore_eos, the same
# prompt ids for every stream). Not done here yet: the PyTorch peer (see bench/generate_throughput.sh
# for single-sequence decode against it) and config b's size (pass --config configs/bench_b.json;
# JTok-M tables at that size need ~3x their size in RAM while the throwaway step trains).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=""; NEW=64; PROMPT_TOKENS=128; THREADS=2; CONC="1 16"
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG=$2; shift 2 ;;
    --new-tokens) NEW=$2; shift 2 ;;
    --prompt-tokens) PROMPT_TOKENS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --concurrency) CONC=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
. bench/bench_lib.sh
[ -d data/train ] && [ -d data/val ] || { echo "data/train and data/val are needed (scripts/prepare_data.sh)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/jtok_servebench_XXXXXX)
SERVER=""
trap '[ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
if [ -z "$CONFIG" ]; then
  CONFIG=$WORK/cfg.json
  cat > "$CONFIG" <<JSON
{ "vocab_size": 50257, "vocab_pad_multiple": 64, "hidden_size": 256, "num_hidden_layers": 6,
  "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 1024,
  "max_position_embeddings": 512, "seq_len": 64, "micro_batch_size": 1, "gradient_accumulation_steps": 1,
  "learning_rate": 1e-4 }
JSON
fi
echo "serve_throughput: prompt $PROMPT_TOKENS tokens, $NEW new tokens per sequence (greedy, ignore_eos), concurrency $CONC, $THREADS threads"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | host: $(nproc) cores | load $(cut -d' ' -f1-3 /proc/loadavg) | OMP_WAIT_POLICY=$OMP_WAIT_POLICY | commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') | config $CONFIG"
IDS=$($PY -c "import json; print(json.dumps([(i * 7919) % 50000 + 100 for i in range($PROMPT_TOKENS)]))")
printf '%-8s %-15s %12s %14s %14s %10s %12s\n' variant tables concurrency "prefill tok/s" "decode tok/s" "RSS MiB" "major faults"
for variant in base +JTok +JTok-M; do
  case $variant in
    base) extra=() ;;
    +JTok) extra=(--jtok true --jtok_layers all) ;;
    +JTok-M) extra=(--jtokm true --jtokm_layers 1,3,5 --jtokm_n_e 4 --jtokm_top_k 2) ;;
  esac
  OMP_NUM_THREADS=$THREADS "$JTOK" train --config "$CONFIG" --out "$WORK/$variant" --max-steps 1 --eval_interval 100 \
    --eval_batches 1 --checkpoint_interval 1 --sample_interval 0 --train_data data/train --val_data data/val \
    "${extra[@]}" > "$WORK/train_$variant.log" 2>&1 || { tail "$WORK/train_$variant.log" >&2; exit 1; }
  CKPT=$(ls -d "$WORK/$variant"/checkpoints/step_* | tail -n 1)
  for tables in ram mmap-warm mmap-cold mmap-cold-nopf; do
    mode=${tables%%-*}
    pf=(); [ "$tables" = mmap-cold-nopf ] && pf=(--no-prefetch)
    if [ "${tables#mmap-cold}" != "$tables" ]; then
      $PY -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$CKPT/model.safetensors"
    elif [ "$tables" = mmap-warm ]; then
      cat "$CKPT/model.safetensors" > /dev/null
    fi
    OMP_NUM_THREADS=$THREADS "$JTOK" serve --checkpoint "$CKPT" --port 0 --tables "$mode" --max-batch 16 "${pf[@]}" \
      > "$WORK/serve.out" 2> "$WORK/serve.err" &
    SERVER=$!
    PORT=""
    for _ in $(seq 600); do
      PORT=$(sed -n 's|.*http://127.0.0.1:\([0-9]*\).*|\1|p' "$WORK/serve.out"); [ -n "$PORT" ] && break; sleep 0.1
    done
    [ -n "$PORT" ] || { cat "$WORK/serve.err" >&2; exit 1; }
    for c in $CONC; do
      r=$(node bench/serve_client.mjs "$PORT" "$c" "$NEW" "$IDS")
      curl -s "http://127.0.0.1:$PORT/metrics" > "$WORK/metrics"
      rss=$(sed -n 's/^jtok_resident_bytes //p' "$WORK/metrics"); maj=$(sed -n 's/^jtok_page_faults_major_total //p' "$WORK/metrics")
      $PY -c "import json,sys; r=json.loads(sys.argv[1]); print('%-8s %-15s %12d %14.1f %14.1f %10d %12s' % (sys.argv[2], sys.argv[3], r['concurrency'], r['prefill_tok_s'], r['decode_tok_s'], int(sys.argv[4]) >> 20, sys.argv[5]))" \
        "$r" "$variant" "$tables" "$rss" "$maj"
    done
    kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=""
  done
done
