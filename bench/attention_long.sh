#!/usr/bin/env bash
# Long-context attention, ours vs PyTorch, config b's shape (d 768, 12 heads of 64, 12 layers),
# micro-batch 1, at T = 1024, 2048, 4096, 8192 (or --seqs "..."), in one run:
#   - one layer's attention forward + backward alone: the O(T) kernels (the default), the T x T
#     probs kernels they replaced (where B H T^2 floats fit), and PyTorch's causal attention
#     (bench/attention_torch.py; torch 1.13 has no scaled_dot_product_attention, so autograd keeps
#     the T x T probabilities as the reference model does);
#   - the whole model: `jtok bench-train` at that T (tokens/s of full steps, peak RSS) and what
#     `jtok flops` accounts for it; with --baseline-bin PATH also a jtok binary built before the
#     O(T) kernels (e.g. commit b5f4351), where it fits in memory.
#   bench/attention_long.sh [--seqs "1024 2048 4096 8192"] [--threads N] [--reps N]
#                           [--model-seqs "1024 8192"] [--baseline-bin PATH]
# Prints one RESULT line per (T, what). CPU seconds are the steadier figure on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
SEQS="1024 2048 4096 8192"; MODEL_SEQS="1024 8192"; THREADS=2; REPS=3; BASE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seqs) SEQS=$2; shift 2 ;;
    --model-seqs) MODEL_SEQS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --baseline-bin) BASE=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
. bench/bench_lib.sh
OP=build/attention_op
LIB=build/libjtok_lib.a  # made by the project's build (scripts/setup.sh, or cmake --build build)
if [ ! -f "$LIB" ]; then echo "attention_long: $LIB is missing: build the project first" >&2; exit 1; fi
if [ ! -x "$OP" ] || [ bench/attention_op.cpp -nt "$OP" ] || [ "$LIB" -nt "$OP" ]; then
  g++ -O3 -march=native -std=c++20 -fopenmp -fno-math-errno -fno-trapping-math -Isrc bench/attention_op.cpp "$LIB" \
    -ldnnl -o "$OP"
fi
echo "attention_long: config b shape, micro-batch 1, $THREADS threads | $(date -u '+%Y-%m-%d %H:%M UTC') | load $(cut -d' ' -f1-3 /proc/loadavg) | commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
field() { "$PY" -c 'import json,sys; d=json.loads(sys.stdin.read())
for k in sys.argv[1].split("."): d = d.get(k, {}) if isinstance(d, dict) else {}
print(d if d != {} else "")' "$1"; }
MEM_KB=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
for T in $SEQS; do
  probs_bytes=$((12 * T * T * 4))
  no_probs=""; [ $((probs_bytes / 1024)) -gt $((MEM_KB / 2)) ] && no_probs=--no-probs
  o=$(OMP_NUM_THREADS=$THREADS "$OP" 1 "$T" 12 12 64 "$REPS" $no_probs)
  echo "[op T=$T] ours -> $o"
  # PyTorch's autograd holds about five (H, T, T) tensors (scores, masked, probabilities, their grads).
  if [ $((5 * probs_bytes / 1024)) -lt $((MEM_KB / 2)) ]; then
    p=$(env -u OPENBLAS_CORETYPE LD_LIBRARY_PATH="$OPENBLAS_OMP" "$PY" bench/attention_torch.py 1 "$T" 12 12 64 "$REPS" --threads "$THREADS")
  else
    p='{"fwd_s": "nan", "bwd_s": "nan", "skipped": "needs ~5 x H T^2 floats"}'
  fi
  echo "[op T=$T] pytorch -> $p"
  ff=$(field flash.fwd_s <<< "$o"); fb=$(field flash.bwd_s <<< "$o"); pf=$(field fwd_s <<< "$p"); pb=$(field bwd_s <<< "$p")
  line="RESULT T=$T attention fwd+bwd (wall s): O(T) $(awk -v a="$ff" -v b="$fb" 'BEGIN{printf "%.4f", a+b}')"
  if [ -z "$no_probs" ]; then
    line+=" | probs kernel $(awk -v a="$(field probs.fwd_s <<< "$o")" -v b="$(field probs.bwd_s <<< "$o")" 'BEGIN{printf "%.4f", a+b}')"
  fi
  line+=" | pytorch $(awk -v a="$pf" -v b="$pb" 'BEGIN{printf "%.4f", a+b}') | ours/pytorch speed $(awk -v a="$ff" -v b="$fb" -v c="$pf" -v d="$pb" 'BEGIN{printf "%.2fx", (c+d)/(a+b)}')"
  echo "$line | kept for backward: O(T) $(field flash.kept_bytes <<< "$o") B, T x T $probs_bytes B"
done
for T in $MODEL_SEQS; do
  sets=(--set seq_len="$T" --set micro_batch_size=1 --set gradient_accumulation_steps=1 --set max_position_embeddings="$T")
  acct=$("$JTOK" flops --config configs/bench_b.json "${sets[@]}" --json)
  echo "RESULT T=$T accounted: activations $(field memory_bytes.activations.total <<< "$acct") B, state $(field memory_bytes.state_fp32 <<< "$acct") B"
  need_kb=$(( ($(field memory_bytes.activations.total <<< "$acct") + $(field memory_bytes.state_fp32 <<< "$acct")) / 1024 ))
  need_base_kb=$(( need_kb + $(field memory_bytes.txt_attention_probs_not_kept <<< "$acct") / 1024 ))
  avail_kb=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
  bins=()
  if [ $((need_kb * 10)) -lt $((avail_kb * 9)) ]; then bins+=("$JTOK"); else echo "RESULT T=$T whole step ($JTOK): skipped, needs ~$((need_kb / 1024)) MB of $((avail_kb / 1024)) MB available"; fi
  if [ -n "$BASE" ]; then
    if [ $((need_base_kb * 10)) -lt $((avail_kb * 9)) ]; then bins+=("$BASE")
    else echo "RESULT T=$T whole step ($BASE): does not fit, needs ~$((need_base_kb / 1024)) MB (T x T probabilities) of $((avail_kb / 1024)) MB available"; fi
  fi
  for bin in "${bins[@]}"; do
    o=$(OMP_NUM_THREADS=$THREADS /usr/bin/time -f '%M' -o /tmp/attention_long.rss "$bin" bench-train --config configs/bench_b.json \
          "${sets[@]}" --steps 1 --warmup 0 2>/dev/null || echo '{}')
    echo "[model T=$T] $bin -> $o"
    rss=$(tail -n 1 /tmp/attention_long.rss)
    if [[ "$rss" =~ ^[0-9]+$ ]] && [ "$o" != '{}' ]; then
      echo "RESULT T=$T whole step ($bin): $(field tokens_per_s <<< "$o") tok/s | $(field cpu_s_per_step <<< "$o") CPU s/step | peak RSS $((rss / 1024)) MB"
    else
      echo "RESULT T=$T whole step ($bin): failed ($(head -n 1 /tmp/attention_long.rss)); killed for memory? see dmesg"
    fi
  done
done
