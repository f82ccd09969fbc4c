#!/usr/bin/env bash
# The whole test suite once more, with every C++ file of jtok and of its tests built with
# AddressSanitizer + UndefinedBehaviorSanitizer (GCC, -O1 -g1, asserts on; build-asan/,
# -DJTOK_SANITIZE=ON): every ctest test that runs jtok's C++ (gtests, shell, Python and node tests
# all run the instrumented binaries, and the fuzz targets replay their corpora; the python_only
# ones, which run none of it, are left to the quick suite). Any report fails the test that
# made it: ASan and LeakSanitizer exit non-zero, UBSan aborts on the first report. The only
# suppressions are for leaks inside system libraries, each explained in tests/sanitizer/lsan.supp.
#   scripts/test_asan.sh [CTEST ARGS...]     (e.g. -R test_checkpoint)
# Prints the build and suite times. Uses ccache when it is installed (scripts/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
if command -v ccache > /dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
fi
mkdir -p build-asan
cmake -S . -B build-asan -DJTOK_SANITIZE=ON "${launcher[@]}" > build-asan/cmake.log
t0=$(date +%s)
echo "asan: building build-asan/ (build-asan/build.log)"
cmake --build build-asan -j"${JTOK_JOBS:-2}" > build-asan/build.log 2>&1 || { tail -n 30 build-asan/build.log; exit 1; }
t1=$(date +%s)
echo "asan: build took $((t1 - t0)) s (load average $(cut -d' ' -f1-3 /proc/loadavg))"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0:strict_string_checks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/sanitizer/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Tests with a slow shape take a smaller one under the sanitizers (each says so in its output).
export JTOK_SANITIZER_BUILD=1
status=0
# Every test but those labelled python_only (no C++ of ours runs in them: CMakeLists.txt).
ctest --test-dir build-asan --output-on-failure -j"${JTOK_JOBS:-2}" --timeout 1500 -LE python_only "$@" || status=$?
t2=$(date +%s)
[ $status -eq 0 ] || bash scripts/rerun_failed.sh build-asan --timeout 1500
echo "asan: suite took $((t2 - t1)) s (load average $(cut -d' ' -f1-3 /proc/loadavg)); build + suite $((t2 - t0)) s"
exit $status
