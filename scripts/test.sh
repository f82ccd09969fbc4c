#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2
# Every parser fuzzed for a short fixed time under ASan + UBSan (libFuzzer, clang): fails on a crash.
bash scripts/fuzz.sh "${JTOK_FUZZ_SECONDS:-20}"
ctest --test-dir build --output-on-failure -j2
