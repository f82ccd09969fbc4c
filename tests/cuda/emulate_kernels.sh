#!/usr/bin/env bash
# src/cuda's kernels run on the CPU through their real host launchers (tests/cuda/emu, no GPU, no
# CUDA toolkit): each .cu rewritten by tests/cuda/emu/cu2cpp.py, compiled by g++ against the fake
# runtime and device headers in tests/cuda/emu/include, linked with the CPU twins (src/ops) and the
# gtest cases: tests/cuda/emu/*_test.cpp and the GPU's own test files in GPU_TESTS, unchanged.
# ccache is used when present. The CPU twins' gemm is oneDNN's (src/ops/linear.cpp): -ldnnl.
#   bash tests/cuda/emulate_kernels.sh                       # the CI set (~20 s with ccache; ~75 s cold on 2 busy cores)
#   bash tests/cuda/emulate_kernels.sh --gtest_filter='*'    # every case (+ ~2 min of paged attention)
#   bash tests/cuda/emulate_kernels.sh --gtest_filter='*Rmsnorm*'
#   EMU_SANITIZE=1 bash tests/cuda/emulate_kernels.sh        # under ASan + UBSan
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
EMU=$ROOT/tests/cuda/emu
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
CXX=${CXX:-g++}
command -v ccache >/dev/null && CXX="ccache $CXX" && export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
KERNELS="row_invariant_linear rmsnorm swiglu rope adamw global_norm cross_entropy logit_digest embedding attention
         paged_kv gemm_ref stats jtok jtokm table_adamw dedup table_rows moe"
TWINS="src/ops/rmsnorm.cpp src/ops/swiglu.cpp src/ops/rope.cpp src/ops/adamw.cpp src/ops/cross_entropy.cpp
       src/ops/embedding.cpp src/ops/attention_decode.cpp src/cuda/logit_digest_ref.cpp src/cuda/kv_pages.cpp
       src/cuda/decoder_sizes.cpp src/model/jtok.cpp src/model/jtokm.cpp src/model/moe.cpp src/model/token_table.cpp src/ops/linear.cpp src/store/disk_rows.cpp
       src/core/profile.cpp src/ops/bf16_weights.cpp src/ops/lowp_convert.cpp src/ops/lowp_gemm.cpp src/ops/q8_gemm.cpp
       src/ops/q8_gemm_avx2.cpp src/train/table_optimizer.cpp
       src/ops/int4_rows.cpp src/ops/lowp_linear.cpp src/core/dtype.cpp"
GPU_TESTS="tests/cuda/test_cuda_paged_kv.cpp tests/cuda/test_cuda_moe_route.cpp
           tests/cuda/test_cuda_table_adamw.cpp tests/cuda/test_cuda_jtokm.cpp
           tests/cuda/test_cuda_embedding.cpp tests/cuda/test_cuda_jtok.cpp
           tests/cuda/test_cuda_dedup.cpp tests/cuda/test_cuda_table_rows.cpp
           tests/cuda/test_cuda_ops.cpp"
# The GPU test's slow cases (a 600-position prefill of every row, ~2 min here) only when asked.
CI_SET="Emulated*:CudaPagedKv.AppendRoundTrip:CudaPagedKv.RopeAtPositionsMatchesCpu:CudaPagedKv.RefusesUnsupportedShapes"
CI_SET="$CI_SET:*CudaPagedAttention*H4_KV2_hd32"
# The GPU tests' cases compiled here unchanged (GPU_TESTS), by their GPU names.
CI_SET="$CI_SET:CudaOps.*"
# -ffunction-sections + --gc-sections: the twins' files are linked without what their other
# functions call (decoder_sizes.cpp's model sizes, lowp_linear.cpp's oneDNN products).
FLAGS="-std=c++20 -O1 -march=native -ffp-contract=off -fopenmp -ffunction-sections"
FLAGS="$FLAGS -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas"
# EMU_SANITIZE=1: AddressSanitizer + UBSan on kernels and host code (out-of-bounds device reads,
# misaligned vector loads, signed overflow); slower.
[ "${EMU_SANITIZE:-0}" = 1 ] && FLAGS="$FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined -g1"
INC="-I$EMU/include -I$ROOT/src -I$ROOT/tests -I$ROOT/tests/cuda"
jobs=()
for k in $KERNELS; do
  python3 "$EMU/cu2cpp.py" "$ROOT/src/cuda/$k.cu" "$T/$k.cpp"
  jobs+=("$T/$k.cpp")
done
jobs+=($(for f in $TWINS $GPU_TESTS; do echo "$ROOT/$f"; done) "$EMU/emu_sched.cpp" "$EMU/mma_not_emulated.cpp" "$EMU/train_store_not_linked.cpp"
       "$EMU"/*_test.cpp)
printf '%s\n' "${jobs[@]}" | xargs -P 2 -I{} sh -c '
  f={}; o='"$T"'/$(echo "$f" | md5sum | cut -c1-12).o
  '"$CXX $FLAGS $INC"' -c "$f" -o "$o"'
$CXX -fopenmp $([ "${EMU_SANITIZE:-0}" = 1 ] && echo -fsanitize=address,undefined) -Wl,--gc-sections "$T"/*.o -ldnnl -lgtest -lgtest_main -pthread -o "$T/emulated"
[ $# -gt 0 ] || set -- --gtest_filter="$CI_SET"
OMP_NUM_THREADS=1 "$T/emulated" "$@"
