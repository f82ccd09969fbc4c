#!/usr/bin/env bash
# src/cuda's kernels run on the CPU through their real host launchers (tests/cuda/emu, no GPU, no
# CUDA toolkit): each .cu rewritten by tests/cuda/emu/cu2cpp.py, compiled by g++ against the fake
# runtime and device headers in tests/cuda/emu/include, linked with the CPU twins (src/ops) and the
# gtest cases in tests/cuda/emu/*_test.cpp. ccache is used when present.
#   bash tests/cuda/emulate_kernels.sh                       # every case
#   bash tests/cuda/emulate_kernels.sh --gtest_filter='*Rmsnorm*'
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
EMU=$ROOT/tests/cuda/emu
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
CXX=${CXX:-g++}
command -v ccache >/dev/null && CXX="ccache $CXX" && export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
KERNELS="row_invariant_linear rmsnorm swiglu rope adamw global_norm cross_entropy logit_digest embedding attention"
TWINS="src/ops/rmsnorm.cpp src/ops/swiglu.cpp src/ops/rope.cpp src/ops/adamw.cpp src/ops/cross_entropy.cpp src/ops/embedding.cpp
       src/cuda/logit_digest_ref.cpp"
FLAGS="-std=c++20 -O1 -ffp-contract=off -fopenmp -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas"
INC="-I$EMU/include -I$ROOT/src -I$ROOT/tests -I$ROOT/tests/cuda"
jobs=()
for k in $KERNELS; do
  python3 "$EMU/cu2cpp.py" "$ROOT/src/cuda/$k.cu" "$T/$k.cpp"
  jobs+=("$T/$k.cpp")
done
jobs+=($(for f in $TWINS; do echo "$ROOT/$f"; done) "$EMU/emu_sched.cpp" "$EMU/mma_not_emulated.cpp" "$EMU"/*_test.cpp)
printf '%s\n' "${jobs[@]}" | xargs -P 2 -I{} sh -c '
  f={}; o='"$T"'/$(echo "$f" | md5sum | cut -c1-12).o
  '"$CXX $FLAGS $INC"' -c "$f" -o "$o"'
$CXX -fopenmp "$T"/*.o -lgtest -lgtest_main -pthread -o "$T/emulated"
OMP_NUM_THREADS=1 "$T/emulated" "$@"
