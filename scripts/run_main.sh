#!/usr/bin/env bash
# The main job: set up, prepare the real corpus, train a small JTok model for a few minutes on
# 2 cores, evaluate it (validation loss, BLiMP) and print a sample.
#   scripts/run_main.sh [--steps N] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=200; OUT=runs/main
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "usage: $0 [--steps N] [--out DIR]" >&2; exit 2 ;;
  esac
done
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j2
[ -n "$(ls data/train/*.bin 2>/dev/null)" ] && [ -n "$(ls data/val/*.bin 2>/dev/null)" ] || bash scripts/prepare_data.sh
rm -rf "$OUT"
build/jtok train --config configs/cpu_tiny.json --jtok true --out "$OUT" --max-steps "$STEPS"
build/jtok eval --checkpoint "$OUT" --blimp-limit 100
build/jtok generate --checkpoint "$OUT" --prompt "It was a dark and stormy night, and" --max-new-tokens 48 --seed 7
