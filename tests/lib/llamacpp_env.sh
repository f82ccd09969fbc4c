# shellcheck shell=bash disable=SC2034  # sourced: its variables are the sourcing script's
# Sourced by the tests that check a GGUF export against llama.cpp (tests/test_gguf_llamacpp.sh,
# tests/test_gguf_variants.sh), after `set -euo pipefail`, with FULL_STEPS set: JTOK, ROOT, a temp
# dir T (removed on exit), PY, OMP_NUM_THREADS=2, and STEPS / LLAMA_THREADS (exported).
# Under the sanitizer build (scripts/test_asan.sh, ctest -j2 beside another test): half the training
# steps (each ~10x slower instrumented), and llama.cpp on 1 thread instead of 2. llama.cpp is not
# instrumented; its 2 threads wait for each other by spinning, which on 2 shared, busy cores took
# 88 s of a 160 s test (measured at load 10). Same export, tokenizer, decode and log-prob checks,
# with the same tolerances.
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
NLC="$ROOT/.cache/npm/llamacpp/node_modules/node-llama-cpp"
[ -d "$NLC" ] || { echo "FAIL: $NLC missing; run scripts/setup.sh"; exit 1; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
PY=/usr/bin/python3
export OMP_NUM_THREADS=2
STEPS=${FULL_STEPS:?} LLAMA_THREADS=2
if [ -n "${JTOK_SANITIZER_BUILD:-}" ]; then
  STEPS=$((FULL_STEPS / 2)) LLAMA_THREADS=1
  echo "NOTE: sanitizer build: $STEPS training steps instead of $FULL_STEPS, llama.cpp on $LLAMA_THREADS thread instead of 2"
fi
export LLAMA_THREADS
source "$ROOT/tests/lib/tiny_run.sh"
