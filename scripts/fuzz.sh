#!/usr/bin/env bash
# Fuzzes every parser (tests/fuzz/fuzz_*.cpp) with libFuzzer under ASan + UBSan, each for SECONDS
# (default 60), starting from its committed corpus (tests/fuzz/corpus/<target>/; new inputs go to a
# scratch directory, not the repository). Fails on any crash, leak, sanitizer report or timeout, and
# copies the input that caused it into tests/fuzz/corpus/<target>/ as a regression input: commit it
# with the fix, and the normal test suite (ctest: fuzz_<target>_corpus) runs it from then on.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
# JTOK_FUZZ_SEED=N fixes libFuzzer's seed (scripts/test.sh, i.e. CI, uses 1, so a CI run explores the
# inputs it explored before rather than failing on a fresh discovery unrelated to the change under
# test); unset, each run draws a new seed: use that, for minutes, to look for new bugs.
# JTOK_FUZZ_JOBS=N runs N targets at a time (default: the cores).
# Needs clang-14 and libfuzzer-14-dev (scripts/setup.sh installs them). Build: build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}; shift || true
[[ "$SECS" =~ ^[0-9]+$ ]] || { echo "usage: $0 [SECONDS] [TARGET...]" >&2; exit 2; }
command -v clang++-14 >/dev/null || { echo "fuzz: clang++-14 missing: run scripts/setup.sh" >&2; exit 2; }
mkdir -p build-fuzz
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DJTOK_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++-14 \
  ${CMAKE_CXX_COMPILER_LAUNCHER:+-DCMAKE_CXX_COMPILER_LAUNCHER=$CMAKE_CXX_COMPILER_LAUNCHER} > build-fuzz/cmake.log
echo "fuzz: building the targets with clang++-14, libFuzzer, ASan and UBSan (build-fuzz/build.log)"
cmake --build build-fuzz -j"$(nproc)" --target fuzzers > build-fuzz/build.log 2>&1 || { tail -n 30 build-fuzz/build.log; exit 1; }
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || for f in tests/fuzz/fuzz_*.cpp; do TARGETS+=("$(basename "$f" .cpp)"); done
export JTOK_ROOT=$PWD OMP_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
# One target's run: its report line(s) into $work/$t/report, its status into $work/$t/status.
fuzz_one() {
  local t=$1
  mkdir -p "$work/$t/new" "$work/$t/artifacts"
  if build-fuzz/"$t" -max_total_time="$SECS" -seed="${JTOK_FUZZ_SEED:-0}" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
       -artifact_prefix="$work/$t/artifacts/" "$work/$t/new" "tests/fuzz/corpus/$t" > "$work/$t/log" 2>&1; then
    runs=$(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t/log" | grep -o '[0-9]*$')
    # libFuzzer's INITED / DONE lines: coverage and corpus (inputs/bytes) before and after.
    grow() { grep -m1 -E "^#[0-9]+[[:space:]]+$1 " "$work/$t/log" | grep -oE 'cov: [0-9]+|corp: [0-9]+/[0-9]+[a-zA-Z]*' | tr '\n' ' '; }
    echo "fuzz $t: ok ($runs runs in ${SECS}s; start: $(grow INITED)-> end: $(grow DONE))" > "$work/$t/report"
    echo 0 > "$work/$t/status"
  else
    { echo "fuzz $t: FAILED"
      grep -E "ERROR|SUMMARY|==[0-9]+==|runtime error|terminate called|what\(\)" "$work/$t/log" | head -n 20
      for a in "$work/$t/artifacts"/*; do
        [ -e "$a" ] || continue
        cp "$a" "tests/fuzz/corpus/$t/regression-$(basename "$a")"
        echo "  regression input: tests/fuzz/corpus/$t/regression-$(basename "$a")"
      done; } > "$work/$t/report"
    echo 1 > "$work/$t/status"
  fi
}
# The targets JTOK_FUZZ_JOBS at a time (default: one a core; each is one single-threaded process),
# each for its full SECONDS; the reports in target order.
jobs_max=${JTOK_FUZZ_JOBS:-$(nproc)}
for t in "${TARGETS[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
  fuzz_one "$t" &
done
wait
failed=0
for t in "${TARGETS[@]}"; do
  cat "$work/$t/report" 2>/dev/null || echo "fuzz $t: FAILED (no report)"
  [ "$(cat "$work/$t/status" 2>/dev/null)" = 0 ] || failed=1
done
exit $failed
