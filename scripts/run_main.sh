#!/usr/bin/env bash
# The main job: set up, prepare the real corpus, train a small JTok model for a few minutes on
# 2 cores, evaluate it (validation loss, BLiMP) and print a sample. It builds only what it runs
# (the jtok binary; scripts/test.sh builds the tests) and ends with its own wall time and the host.
#   scripts/run_main.sh [--steps N] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
STEPS=200; OUT=runs/main
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "usage: $0 [--steps N] [--out DIR]" >&2; exit 2 ;;
  esac
done
bash scripts/setup.sh
launcher=()
if command -v ccache > /dev/null; then  # a second run on the same machine rebuilds from the cache
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
fi
# The CUDA kernels only where a GPU can run them: on a machine without one the main job skips their
# compile (the test command, scripts/test.sh, builds them wherever nvcc is).
cuda=OFF
nvidia-smi -L > /dev/null 2>&1 && cuda=AUTO
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DJTOK_CUDA=$cuda "${launcher[@]}" > /dev/null
cmake --build build -j2 --target jtok
[ -n "$(ls data/train/*.bin 2>/dev/null)" ] && [ -n "$(ls data/val/*.bin 2>/dev/null)" ] || bash scripts/prepare_data.sh
rm -rf "$OUT"
build/jtok train --config configs/cpu_tiny.json --jtok true --out "$OUT" --max-steps "$STEPS"
build/jtok eval --checkpoint "$OUT" --blimp-limit 100
build/jtok generate --checkpoint "$OUT" --prompt "It was a dark and stormy night, and" --max-new-tokens 48 --seed 7
# The whole script's wall time (setup, build, data, training, evaluation) and where it ran.
secs=$(( $(date +%s) - start ))
model=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)
echo "run_main: $((secs / 60)) min $((secs % 60)) s on $(nproc) cores (${model:-unknown CPU})"
