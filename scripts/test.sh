#!/usr/bin/env bash
# Sets up, builds and runs the test suite.
#   bash scripts/test.sh          # the quick suite: setup, the normal build, every ctest test
#   bash scripts/test.sh --full   # also every parser fuzzed under ASan + UBSan, and the whole suite
#                                 # again built with ASan + UBSan (what CI runs: .ci/run)
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
case "${1:-}" in
  "") ;;
  --full) full=1 ;;
  *) echo "usage: bash scripts/test.sh [--full]" >&2; exit 2 ;;
esac
bash scripts/setup.sh
launcher=()
if command -v ccache > /dev/null; then  # a second run on the same machine rebuilds from the cache
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CMAKE_CXX_COMPILER_LAUNCHER=ccache  # the last for fuzz.sh
fi
# JTOK_CUDA=AUTO: the CUDA kernels and their tests compiled wherever nvcc is (run_main.sh may have
# configured this build without them on a machine with no GPU).
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DJTOK_CUDA=${JTOK_CUDA:-AUTO} "${launcher[@]}"
cmake --build build -j2
# Every parser fuzzed for a short fixed time under ASan + UBSan (libFuzzer, clang): fails on a crash.
# A fixed seed: long random-seed campaigns (scripts/fuzz.sh 600) look for new bugs, not CI.
if [ $full = 1 ]; then
  JTOK_FUZZ_SEED=${JTOK_FUZZ_SEED:-1} bash scripts/fuzz.sh "${JTOK_FUZZ_SECONDS:-20}"
fi
# A failure stops the run (ctest's exit status); the failing tests first run once more, alone, with
# their whole output last in the log, so that a failure that does not come back (a flake: timing,
# load) is told apart from one that does, and the cause is readable at the end of the output.
if ! ctest --test-dir build --output-on-failure -j2; then
  bash scripts/rerun_failed.sh build
  exit 8
fi
# The whole suite again with ASan + UBSan (build-asan/): fails on any sanitizer report. Every test
# runs; the few whose full shapes take minutes under ASan take smaller ones there (each prints a
# NOTE saying so; docs/reliability.md lists them with their times).
if [ $full = 1 ]; then
  bash scripts/test_asan.sh
else
  echo "test.sh: quick suite passed (the fuzzers and the ASan + UBSan suite: bash scripts/test.sh --full)"
fi
