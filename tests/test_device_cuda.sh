#!/usr/bin/env bash
# `train --device cuda` and `bench-train --device cuda` (issue 39), `eval`, `generate` and `serve`
# (issue 40) stop before reading anything, with one error line that says why: a build without nvcc
# says it was built without CUDA (the sanitizer build is one); a CUDA build on a machine without a
# GPU (CI, the development machines) names the driver and runtime versions it saw (driver 0 = none
# installed); with a GPU the device is taken and the missing config file (checkpoint) is what stops
# it. CMake passes JTOK_CUDA_BUILT and JTOK_GPU_FOUND (what it found at configure).
# --device other than cpu / cuda is refused by the option check.
set -euo pipefail
JTOK=${JTOK_BIN:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
case "${JTOK_CUDA_BUILT:-OFF}" in
  ON) if [ "${JTOK_GPU_FOUND:-OFF}" = ON ]; then
        want='.*none\.json'
      else
        want='--device cuda: no CUDA device was found \(driver version [0-9]+, runtime version [1-9][0-9]*'
      fi ;;
  *) want='--device cuda: this jtok was built without CUDA' ;;
esac
for cmd in "train --out $T/run" bench-train; do
  # shellcheck disable=SC2086  # cmd is two words for train
  if $JTOK $cmd --config "$T/none.json" --device cuda > "$T/out" 2>&1; then
    fail "$cmd --device cuda succeeded: $(cat "$T/out")"
  fi
  grep -Eq "^jtok: error: $want" "$T/out" || fail "$cmd --device cuda: expected /$want/, got: $(cat "$T/out")"
  [ ! -e "$T/run" ] || fail "$cmd --device cuda made its run directory"
  echo "$cmd: $(cat "$T/out")"
done
# `bench-peak --device cuda` likewise; with a GPU, one small checked product and copy, its JSON line. A
# bad --product is refused by name before any GPU is asked, and --product is the GPU's only.
if [ "$want" = '.*none\.json' ]; then
  $JTOK bench-peak --device cuda --product 64,48,32 --copy-mb 1 --reps 1 > "$T/out" 2> "$T/err" ||
    fail "bench-peak --device cuda: $(cat "$T/err")"
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); p=j["products"][0]
assert (p["M"], p["N"], p["K"]) == (64, 48, 32) and p["tflops"] > 0 and p["max_rel_error"] <= 2**-8, j
assert j["device_copy_gbs"] > 0 and j["h2d_gbs"] > 0 and j["d2h_gbs"] > 0, j' "$T/out" || fail "bench-peak: $(cat "$T/out")"
else
  if $JTOK bench-peak --device cuda > "$T/out" 2>&1; then fail "bench-peak --device cuda succeeded: $(cat "$T/out")"; fi
  grep -Eq "^jtok: error: $want" "$T/out" || fail "bench-peak --device cuda: expected /$want/, got: $(cat "$T/out")"
fi
echo "bench-peak: $(head -c 300 "$T/out")"
for bad in "--device cuda --product 64,48" "--device cuda --product 0,1,1" "--product 64,48,32"; do
  # shellcheck disable=SC2086
  if $JTOK bench-peak $bad > "$T/out" 2>&1; then fail "bench-peak $bad accepted"; fi
  grep -q "^jtok: error: bench-peak: --product" "$T/out" || fail "bench-peak $bad: $(cat "$T/out")"
done
# `eval --device cuda` (issue 40) stops the same way before its checkpoint is read: the missing one here
# is what stops it only where a GPU is taken.
want_eval=$want
[ "${JTOK_CUDA_BUILT:-OFF}/${JTOK_GPU_FOUND:-OFF}" != ON/ON ] || want_eval='checkpoint .*none does not exist'
if $JTOK eval --checkpoint "$T/none" --device cuda --no-blimp > "$T/out" 2>&1; then
  fail "eval --device cuda succeeded: $(cat "$T/out")"
fi
grep -Eq "^jtok: error: $want_eval" "$T/out" || fail "eval --device cuda: expected /$want_eval/, got: $(cat "$T/out")"
echo "eval: $(cat "$T/out")"
if $JTOK train --config "$T/none.json" --out "$T/run" --device tpu > "$T/out" 2>&1; then fail "--device tpu accepted"; fi
grep -q -- "--device" "$T/out" || fail "--device tpu: the error does not name the option: $(cat "$T/out")"
# `generate --device cuda` and `serve --device cuda` (issue 40) stop the same way before the checkpoint
# is read (with a GPU: the missing checkpoint is what stops them); serve binds no port first.
# --precision / --table-rows / --int8-decode / --pdl / --tensor-cores are the GPU decoder's: with --device cpu
# they are refused, named.
[ "$want" = '.*none\.json' ] && want='checkpoint .*none does not exist'
for cmd in "generate --prompt x" "serve --port 0"; do
  # shellcheck disable=SC2086  # cmd is three words
  if $JTOK $cmd --checkpoint "$T/none" --device cuda > "$T/out" 2>&1; then
    fail "$cmd --device cuda succeeded: $(cat "$T/out")"
  fi
  grep -Eq "^jtok: error: $want" "$T/out" || fail "$cmd --device cuda: expected /$want/, got: $(cat "$T/out")"
  ! grep -q "on http://" "$T/out" || fail "$cmd --device cuda: listened before failing: $(cat "$T/out")"
  echo "$cmd: $(grep '^jtok: error' "$T/out")"
  for opt in "--precision bf16" "--table-rows hbm" "--int8-decode off" "--pdl on" "--tensor-cores on"; do
    # shellcheck disable=SC2086
    if $JTOK $cmd --checkpoint "$T/none" $opt > "$T/out" 2>&1; then fail "$cmd $opt on the CPU accepted"; fi
    grep -q "^jtok: error: ${opt% *} is for --device cuda" "$T/out" || fail "$cmd $opt on the CPU: $(cat "$T/out")"
  done
  # Tensor-core products are bf16's: beside --precision fp32 they are refused, naming both, before any GPU
  # is looked for.
  # shellcheck disable=SC2086
  if $JTOK $cmd --checkpoint "$T/none" --device cuda --precision fp32 --tensor-cores on > "$T/out" 2>&1; then
    fail "$cmd --precision fp32 --tensor-cores on accepted"
  fi
  grep -q "^jtok: error: --tensor-cores on multiplies in bf16; --precision fp32" "$T/out" ||
    fail "$cmd --precision fp32 --tensor-cores on: $(cat "$T/out")"
  # --tables hbm (a GPU copy of every table) is refused on the CPU, and beside another --table-rows, named,
  # before any GPU is looked for.
  # shellcheck disable=SC2086
  if $JTOK $cmd --checkpoint "$T/none" --tables hbm > "$T/out" 2>&1; then fail "$cmd --tables hbm on the CPU accepted"; fi
  grep -q "^jtok: error: --tables hbm copies every table to the GPU: it needs --device cuda" "$T/out" ||
    fail "$cmd --tables hbm on the CPU: $(cat "$T/out")"
  # shellcheck disable=SC2086
  if $JTOK $cmd --checkpoint "$T/none" --tables hbm --device cuda --table-rows staged > "$T/out" 2>&1; then
    fail "$cmd --tables hbm --table-rows staged accepted"
  fi
  grep -q "^jtok: error: --tables hbm reads every step's rows from the GPU's copy; --table-rows staged" "$T/out" ||
    fail "$cmd --tables hbm --table-rows staged: $(cat "$T/out")"
  # shellcheck disable=SC2086
  if $JTOK $cmd --checkpoint "$T/none" --device tpu > "$T/out" 2>&1; then fail "$cmd --device tpu accepted"; fi
  grep -q -- "--device" "$T/out" || fail "$cmd --device tpu: the error does not name the option: $(cat "$T/out")"
done
if $JTOK eval --checkpoint "$T/none" --tables hbm --no-blimp > "$T/out" 2>&1; then fail "eval --tables hbm on the CPU accepted"; fi
grep -q "^jtok: error: --tables hbm copies every table to the GPU" "$T/out" || fail "eval --tables hbm: $(cat "$T/out")"
# eval on the CPU's forward (no decoder) refuses the decoder's options, naming them, before the checkpoint.
for opt in "--int8-decode off" "--pdl on" "--tensor-cores on"; do
  # shellcheck disable=SC2086
  if $JTOK eval --checkpoint "$T/none" $opt --no-blimp > "$T/out" 2>&1; then fail "eval $opt on the CPU accepted"; fi
  grep -q "^jtok: error: eval: .*${opt% *}.* are for a decoder (--device cuda)" "$T/out" || fail "eval $opt: $(cat "$T/out")"
done
if $JTOK bench-decode --config "$T/none.json" --tables hbm > "$T/out" 2>&1; then fail "bench-decode --tables hbm accepted"; fi
grep -q "^jtok: error: bench-decode: --tables says where the model's tables live" "$T/out" ||
  fail "bench-decode --tables hbm: $(cat "$T/out")"
# A build with the kernels costs a process that never touches a GPU nothing: cuBLASLt (~0.5 GB) is
# loaded on first use (src/cuda/cublaslt_api.h), not linked, so `jtok --help` stays small. (The
# resident-memory bound is for the builds with the kernels: the sanitizer build has none, and
# ASan's own shadow memory would dominate its figure.)
! ldd "$JTOK" 2>/dev/null | grep -q libcublas || fail "jtok links cuBLAS at start-up: $(ldd "$JTOK" | grep cublas)"
if [ "${JTOK_CUDA_BUILT:-OFF}" = ON ]; then
  rss=$(python3 -c '
import os, subprocess, sys
p = subprocess.Popen([sys.argv[1], "--help"], stdout=subprocess.DEVNULL)
print(os.wait4(p.pid, 0)[2].ru_maxrss)' "$JTOK")
  [ "$rss" -lt 65536 ] || fail "jtok --help peaks at $rss kB of resident memory (>= 64 MB)"
  echo "jtok --help: peak RSS $rss kB, no cuBLAS loaded"
fi
echo "test_device_cuda: ok"
