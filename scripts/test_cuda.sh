#!/usr/bin/env bash
# The CUDA tests on a GPU host (issue 39): builds jtok with the kernels (build-cuda/, JTOK_CUDA=ON,
# the CUDA tests registered: -DJTOK_GPU_FOUND=ON), runs every test labelled cuda, then
# test_cuda_ops under compute-sanitizer's memcheck and racecheck. Any failure or sanitizer report
# fails the script. Logs: build-cuda/{build,ctest,memcheck,racecheck}.log.
#   bash scripts/test_cuda.sh [GTEST FILTER]     (e.g. 'CudaOps.Rmsnorm*')
#   JTOK_CUDA_BUILD=dir  an existing build with the CUDA tests (skips configure and build: a binary
#                        built on another machine and carried here)
set -euo pipefail
cd "$(dirname "$0")/.."
filter=${1:-*}
B=${JTOK_CUDA_BUILD:-build-cuda}
if [ -z "${JTOK_CUDA_BUILD:-}" ]; then
  launcher=()
  if command -v ccache > /dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  fi
  mkdir -p "$B"
  cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DJTOK_CUDA=ON -DJTOK_GPU_FOUND=ON "${launcher[@]}" > "$B/cmake.log"
  cmake --build "$B" -j"${JTOK_JOBS:-$(nproc)}" --target jtok test_cuda_ops > "$B/build.log" 2>&1 ||
    { tail -n 30 "$B/build.log"; exit 1; }
fi
nvidia-smi -L || true
status=0
if [ "$filter" = "*" ]; then
  ctest --test-dir "$B" -L cuda --output-on-failure > "$B/ctest.log" 2>&1 || status=1
else
  "$B/test_cuda_ops" --gtest_filter="$filter" > "$B/ctest.log" 2>&1 || status=1
fi
tail -n 5 "$B/ctest.log"
grep -h '^cuda case\|^device:' "$B/ctest.log" || true
# compute-sanitizer: memcheck (out-of-bounds, misaligned, uninitialised reads via --tool initcheck
# separately), racecheck (shared-memory hazards). --error-exitcode makes any report a failure.
if command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    if compute-sanitizer --tool "$tool" --error-exitcode 9 "$B/test_cuda_ops" --gtest_filter="$filter" \
         > "$B/$tool.log" 2>&1; then
      echo "compute-sanitizer $tool: clean"
    else
      echo "compute-sanitizer $tool: FAILED ($B/$tool.log)"; tail -n 20 "$B/$tool.log"; status=1
    fi
  done
else
  echo "compute-sanitizer not found: memcheck / racecheck not run"; status=1
fi
[ $status = 0 ] && echo "test_cuda.sh: all CUDA tests passed" || echo "test_cuda.sh: FAILED"
exit $status
