#!/usr/bin/env bash
# src/cuda's kernels run on the CPU through their real host launchers (tests/cuda/emu, no GPU, no
# CUDA toolkit): each .cu rewritten by tests/cuda/emu/cu2cpp.py, compiled by g++ against the fake
# runtime, device and cuBLASLt headers in tests/cuda/emu/include, linked with the build's CPU engine
# (libjtok_lib.a: the twins) and the gtest cases: tests/cuda/emu/*_test.cpp and the GPU's own test
# files in GPU_TESTS, unchanged. ccache is used when present.
#   bash tests/cuda/emulate_kernels.sh                       # the CI set, in both thread orders
#   bash tests/cuda/emulate_kernels.sh --gtest_filter='*'    # every case (~15 min)
#   bash tests/cuda/emulate_kernels.sh --gtest_filter='*Rmsnorm*'
#   EMU_ORDER=reverse bash tests/cuda/emulate_kernels.sh --gtest_filter='*Attention*'  # threads last first
#   EMU_STREAMS=lazy bash tests/cuda/emulate_kernels.sh --gtest_filter='*Staged*'   # stream work run when awaited
#   EMU_SANITIZE=1 bash tests/cuda/emulate_kernels.sh        # under ASan + UBSan
#   EMU_KEEP=/tmp/emu bash tests/cuda/emulate_kernels.sh --gtest_list_tests   # keep the binary
#   EMU_JTOK=/tmp/jtok-emu bash tests/cuda/emulate_kernels.sh --gtest_filter=-'*'  # jtok --device cuda
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
EMU=$ROOT/tests/cuda/emu
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
CXX=${CXX:-g++}
command -v ccache >/dev/null && CXX="ccache $CXX" && export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
# Every .cu but cublaslt_api.cu (dlopen of the library: fake_cublaslt.cpp fills its table instead) and
# kernel_trace.cu (CUPTI, a real GPU's: fake_kernel_trace.cpp says it cannot start);
# the tensor cores' inline PTX (mma_bf16.cuh) as warp-collective functions (emu/include/emu_ptx.h).
KERNELS=
for f in "$ROOT"/src/cuda/*.cu; do
  k=$(basename "$f" .cu)
  [ "$k" = cublaslt_api ] || [ "$k" = kernel_trace ] || KERNELS="$KERNELS $k"
done
# The CPU engine (the twins, the models, the trainer) is the build's own jtok_lib. Its one file
# that asks whether CUDA is built, device_require.cpp, is compiled here with the answer yes.
LIB=${JTOK_LIB:-$ROOT/build/libjtok_lib.a}
[ -f "$LIB" ] || { echo "emulate_kernels.sh: $LIB not found: build first (cmake --build build --target jtok_lib) or set JTOK_LIB" >&2; exit 1; }
HOST="src/cuda/device_require.cpp"
GPU_TESTS=$(cd "$ROOT" && ls tests/cuda/test_cuda_*.cpp)
# The GPU test's slow cases (a 600-position prefill of every row, ~2 min here) only when asked.
CI_SET="Emulated*:CudaPagedKv.AppendRoundTrip:CudaPagedKv.ReadyQkv*:CudaPagedKv.RefusesUnsupportedShapes"
CI_SET="$CI_SET:*CudaPagedAttention*H4_KV2_hd32"
# The GPU tests' cases compiled here unchanged (GPU_TESTS), by their GPU names: every op case, and
# of the products, model, trainer and decoder the cases that take a few seconds here (the rest, the
# bf16 graphs among them, with --gtest_filter='*'; docs/cuda.md lists their times).
CI_SET="$CI_SET:CudaDevice.*:CudaOps.*:CudaVec.*:*CudaLinear*:*CudaGemm*:CudaGemmBits.GemmLtMatchesGemmRef:CudaRowInvariant.*"
CI_SET="$CI_SET:CudaRowInvariantQ8.*:CudaDecoderQ8.*:CudaQ8Dequant.*:CudaRowInvariantMma.*"
CI_SET="$CI_SET:CudaDecoderInvariant.TensorCoreProductsNearTheCudaCores:CudaDecoderInvariant.TensorCoreProductsRefusedInFp32"
CI_SET="$CI_SET:*CudaAttention.*T33_KV2_hd64:CudaAttentionBits.BackwardThroughRopeMatchesCpu:CudaAttentionBits.WideWarpsGiveTheSameBits:CudaModel.*StepMatchesCpu:CudaModel.Refuses*:CudaModel.FusedProducts*"
CI_SET="$CI_SET:CudaModel.StepIsDeterministic:CudaModel.AttentionRowsGiveTheSameStep:CudaModel.TenAdamWStepsMatchCpu:CudaModel.EmbeddingRowsGiveTheFlatBits"
CI_SET="$CI_SET:CudaTrainer.PoisonedGradientRefusedWithAFrozenBackbone:CudaTrainer.DeviceMemoryWithinItsPlan"
CI_SET="$CI_SET:CudaTrainer.ProfileTimesEveryPhaseAndChangesNoBits:CudaTableStreams.*"
CI_SET="$CI_SET:CudaDecoder.*MatchesCpu:CudaDecoder.*Fork*:CudaDecoder.LowpExport*"
CI_SET="$CI_SET:CudaKernelTrace.*"
CI_SET="$CI_SET:CudaDecoderGraphs.PdlGivesThePlainGraphsBits:CudaDecoderGraphs.ADenseLayerDecodesInSixKernels:CudaDecoderGraphs.AJtokmLayerAddsOneKernel:CudaDecoder.*Blocks*:CudaDecoder.DecodePickMatchesHostPicksFp32:CudaHostRows.*:CudaStepRowsStaged.*"
# Under the sanitizers, less: the cases that repeat another case's kernels on its shapes (ten steps of
# a model whose step is a case, the same step twice, or profiled).
ASAN_LESS="-CudaModel.TenAdamWStepsMatchCpu:CudaModel.StepIsDeterministic:CudaTrainer.ProfileTimes*"
ASAN_LESS="$ASAN_LESS:CudaModel.EmbeddingRowsGiveTheFlatBits"  # the table AdamW's and the steps' kernels again
ASAN_LESS="$ASAN_LESS:CudaDecoderGraphs.PdlGivesThePlainGraphsBits"  # the plain graphs twice; its fallback is host code
ASAN_LESS="$ASAN_LESS:CudaTableStreams.EagerSyncGivesTheDeferredBits:EmulatedTrainer.*"  # the trainers' kernels again
# -O2: the emulated GPU runs ~2x faster than at -O1. Strict aliasing stays on, so a kernel that views
# a value's bits through another type (undefined on the GPU too) fails its case here.
FLAGS="-std=c++20 -O2 -march=native -ffp-contract=off -fopenmp -ffunction-sections -DJTOK_HAVE_CUDA=1"
FLAGS="$FLAGS -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas -Wno-subobject-linkage"
# The architecture the emulated device reports (sm_90), recorded as CMake records the build's for
# device_require.cpp (xargs below reads \" as a quote inside the word; the benches, compiled without
# xargs, get the backslashes too and read no JTOK_CUDA_ARCHS).
# shellcheck disable=SC2089
FLAGS="$FLAGS -DJTOK_CUDA_ARCHS=\\\"90\\\""
# EMU_SANITIZE=1: AddressSanitizer + UBSan on kernels and host code (out-of-bounds device reads,
# misaligned vector loads, signed overflow); slower. Set by itself when the library was built so
# (scripts/test_asan.sh's build): its objects need the sanitizers' runtime.
# (grep reads all of nm's output: with pipefail, grep -q would end nm by SIGPIPE and fail the test)
nm -A "$LIB" 2>/dev/null | grep __asan_init > /dev/null && EMU_SANITIZE=1
# The sanitizers instrument the emulated GPU (kernels, launchers, runtime), not the test cases: a
# case's own code is host code the CPU suites check, and a case object built once serves both
# suites (the same command line: a ccache hit in the second).
CASE_FLAGS=$FLAGS
[ "${EMU_SANITIZE:-0}" = 1 ] && FLAGS="$FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined -g1"
INC="-I$EMU/include -I$ROOT/src -I$ROOT/tests -I$ROOT/tests/cuda"
# The emulated GPU ($T/dev: src/cuda, the fakes) and the cases ($T/cases), compiled two at a time.
mkdir -p "$T/dev" "$T/cases"
dev=() cases=()
for k in $KERNELS; do
  python3 "$EMU/cu2cpp.py" "$ROOT/src/cuda/$k.cu" "$T/$k.cpp"
  dev+=("$T/$k.cpp")
done
for f in $HOST; do dev+=("$ROOT/$f"); done
dev+=("$EMU/emu_sched.cpp" "$EMU/fake_cublaslt.cpp" "$EMU/fake_kernel_trace.cpp" "$EMU/emu_streams.cpp" "$EMU/emu_memory.cpp")
for f in $GPU_TESTS; do cases+=("$ROOT/$f"); done
cases+=("$EMU"/*_test.cpp)
{ for f in "${dev[@]}"; do echo "dev $f $FLAGS"; done; for f in "${cases[@]}"; do echo "cases $f $CASE_FLAGS"; done; } |
  xargs -P 2 -L 1 sh -c 'dir=$0 src=$1; shift; o='"$T"'/$dir/$(echo "$src" | md5sum | cut -c1-12).o; '"$CXX"' "$@" '"$INC"' -c "$src" -o "$o"'
LINK="-fopenmp -Wl,--gc-sections"
[ "${EMU_SANITIZE:-0}" = 1 ] && LINK="$LINK -fsanitize=address,undefined"
LIBS="$LIB -ldnnl $(pkg-config --libs cpp-httplib) $(mpicxx --showme:link) -pthread"
$CXX $LINK "$T"/dev/*.o "$T"/cases/*.o $LIBS -lgtest -lgtest_main -o "$T/emulated"
# EMU_JTOK=path: the jtok command itself on the emulated GPU (the build's apps objects linked with
# it), so the GPU's own scripts (tests/cuda/train_cuda.sh, infer_cuda.sh) run --device cuda here.
if [ -n "${EMU_JTOK:-}" ]; then
  APPS=$(dirname "$LIB")/CMakeFiles/jtok.dir/Unity  # the apps as one unity object (CMakeLists.txt)
  $CXX $LINK "$T"/dev/*.o "$APPS"/*.o $LIBS -o "$EMU_JTOK"
fi
# EMU_KEEP=path keeps the emulated test binary there (to run cases one by one).
[ -z "${EMU_KEEP:-}" ] || cp "$T/emulated" "$EMU_KEEP"
# The GPU session's op benches (bench/cuda_*.cpp, each a main) on the emulated GPU: built for the CI
# set and run there at small shapes (their code, not their timings: a bench that stops or prints no
# JSON fails here, not in a GPU session's minutes); EMU_BENCH=dir keeps them (bench_cuda_*).
BENCH_DIR=${EMU_BENCH:-$T/bench}
if [ $# -eq 0 ] || [ -n "${EMU_BENCH:-}" ]; then
  mkdir -p "$BENCH_DIR"
  for src in attention_op:attention row_invariant_op:row_invariant host_rows:host_rows grouped_op:grouped; do
    # shellcheck disable=SC2090  # the benches do not read JTOK_CUDA_ARCHS
    $CXX $FLAGS $INC -I"$ROOT/bench" -c "$ROOT/bench/cuda_${src%%:*}.cpp" -o "$T/bench_${src#*:}.o"
    $CXX $LINK "$T"/dev/*.o "$T/bench_${src#*:}.o" $LIBS -o "$BENCH_DIR/bench_cuda_${src#*:}"
  done
fi
run_benches() {
  OMP_NUM_THREADS=1 "$BENCH_DIR/bench_cuda_attention" 1 40 2 1 32 1 > "$T/attention.json"
  OMP_NUM_THREADS=1 "$BENCH_DIR/bench_cuda_row_invariant" 1 tiny > "$T/row_invariant.json"
  OMP_NUM_THREADS=1 "$BENCH_DIR/bench_cuda_host_rows" --layers 2 --tables 3 --d 64 --vocab 3000 --decode 4 \
    --prefill 96 --reps 1 > "$T/host_rows.json"
  OMP_NUM_THREADS=1 "$BENCH_DIR/bench_cuda_grouped" 1 4 2 40 32 24 > "$T/grouped.json"
  python3 - "$T/attention.json" "$T/host_rows.json" "$T/grouped.json" "$T/row_invariant.json" <<'PY'
import json, sys
att = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in map(json.loads, open(sys.argv[2])) if "step" in r]  # (a decode step, a prefill) x 3 paths
grp = [json.loads(l) for l in open(sys.argv[3])]
lines = [json.loads(l) for l in open(sys.argv[4])]
ri = [r for r in lines if "C" in r]  # 3 shapes x M 1, 4, 16
ex = [r for r in lines if r["shape"] == "experts"]  # M 1, 4, 16
dq = [r for r in lines if r["shape"] == "dequant_layer"]
assert len(att) == 1 and att[0]["T"] == 40 and att[0]["fwd_ms"] > 0 and att[0]["fwd_wide_ms"] > 0, att
assert att[0]["bwd_wide_ms"] > 0 and att[0]["bwd_tiles_ms"] > 0, att
assert len(rows) == 6 and all(r["ms"] > 0 for r in rows), rows
assert len(grp) == 1 and grp[0]["rows"] == 80 and grp[0]["fwd_ms"] > 0 and grp[0]["cublaslt_over_grouped"] > 0, grp
assert len(ri) == 9 and all(r[k] > 0 for r in ri for k in ("row_invariant_us", "cublaslt_us", "q8_us", "q8_speedup",
                                                          "mma_us", "mma_speedup")), ri
assert [("normed_us" in r and r["mma_normed_us"] > 0 and r["router_us"] > 0) for r in ri] == [True] * 3 + [False] * 3 + [True] * 3, ri
assert [("side_us" in r and r["side_us"] > 0) for r in ri] == [True] * 3 + [False] * 6, ri  # q's, not the fp32 LM head's
assert [r["M"] for r in ex] == [1, 4, 16] and [r["active_experts"] for r in ex] == [2, 8, 8], ex
assert all(r[k] > 0 for r in ex for k in ("experts_us", "experts_q8_us", "q8_speedup")), ex
assert len(dq) == 1 and dq[0]["values"] == 61440 and dq[0]["dequant_us"] > 0 and len(lines) == 13, lines
print(f"emulated benches: bench_cuda_attention 1 line, bench_cuda_host_rows {len(rows)} lines, bench_cuda_grouped 1 line, "
      f"bench_cuda_row_invariant {len(lines)} lines")
PY
}
# The CI set in both thread orders (EMU_ORDER, emu_sched.cpp: a block's threads and a grid's blocks
# first to last, then last to first), the second with its streams lazy (EMU_STREAMS, emu_streams.cpp:
# work runs when something waits for it, not when submitted), each case's copies to the host hashed
# (EMU_DIGEST, emu/emu_digest_test.cpp): a case whose bits depend on the order (a missing barrier,
# floats added in arrival order, a missing wait between streams) fails here, named. The GPU fixes
# none of these orders.
run_both_orders() {
  OMP_NUM_THREADS=1 EMU_DIGEST="$T/forward.txt" "$T/emulated" --gtest_filter="$1"
  OMP_NUM_THREADS=1 EMU_ORDER=reverse EMU_STREAMS=lazy EMU_DIGEST="$T/reverse.txt" "$T/emulated" --gtest_filter="$1" \
    > "$T/reverse.log" ||
    { cat "$T/reverse.log"; echo "emulate_kernels.sh: the CI set fails with threads and blocks in reverse order and streams lazy" >&2; exit 1; }
  python3 - "$T/forward.txt" "$T/reverse.txt" <<'PY'
import sys
fwd, rev = (dict(l.split() for l in open(p)) for p in sys.argv[1:])
differ = sorted(k for k in fwd if fwd[k] != rev.get(k))
assert fwd.keys() == rev.keys() and fwd, (len(fwd), len(rev))
if differ:
    sys.exit("emulate_kernels.sh: these cases copy other bits to the host when threads and blocks run in reverse "
             "order and streams lazy (a race, floats summed in arrival order, or a missing wait between "
             "streams):\n  " + "\n  ".join(differ))
print(f"thread and block order, streams at once and lazy: the same bits both ways in all {len(fwd)} cases")
PY
}
if [ $# -gt 0 ]; then
  OMP_NUM_THREADS=1 "$T/emulated" "$@"
else
  # Under the sanitizers one order: they look for bad memory accesses, the plain build compares orders.
  if [ "${EMU_SANITIZE:-0}" = 1 ]; then OMP_NUM_THREADS=1 "$T/emulated" --gtest_filter="$CI_SET$ASAN_LESS"
  else run_both_orders "$CI_SET"; fi
  run_benches
fi
