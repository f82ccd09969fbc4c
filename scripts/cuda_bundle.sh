#!/usr/bin/env bash
# Packs what a GPU host needs to run the CUDA tests without building there (its minutes are few):
# the jtok binary, test_cuda_ops, and the shared libraries they load that such a host lacks: every
# one ldd resolves but glibc's, the compiler runtime's and CUDA's, which the host has (docs/cuda.md).
# Build first (cmake --build build --target jtok test_cuda_ops).
#   bash scripts/cuda_bundle.sh [BUILD_DIR]    -> BUILD_DIR/cuda-bundle.tar.gz (default build/; ~36 MB)
# On the GPU host: JTOK_CUDA_BUNDLE=build/cuda-bundle.tar.gz bash scripts/test_cuda.sh
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
for f in jtok test_cuda_ops; do
  [ -x "$B/$f" ] || { echo "cuda_bundle.sh: $B/$f not built (cmake --build $B --target jtok test_cuda_ops)" >&2; exit 1; }
done
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
mkdir -p "$T/bundle/bin" "$T/bundle/lib"
cp "$B/jtok" "$B/test_cuda_ops" "$T/bundle/bin/"
if [ -x "$B/bench_cuda_attention" ]; then cp "$B/bench_cuda_attention" "$T/bundle/bin/"; fi  # attention timings
if [ -x "$B/bench_cuda_host_rows" ]; then cp "$B/bench_cuda_host_rows" "$T/bundle/bin/"; fi  # table rows from host memory
if [ -x "$B/bench_cuda_row_invariant" ]; then cp "$B/bench_cuda_row_invariant" "$T/bundle/bin/"; fi  # decode products
if [ -x "$B/bench_cuda_grouped" ]; then cp "$B/bench_cuda_grouped" "$T/bundle/bin/"; fi  # MoE's grouped products
ldd "$B/jtok" "$B/test_cuda_ops" | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libresolv.so*) ;;  # glibc
    libstdc++.so*|libgcc_s.so*|libgomp.so*) ;;  # the compiler runtime: the host has it (and compute-sanitizer needs its own)
    libcuda.so*|libcublas*|libcudart*) ;;  # the host's CUDA
    *) cp -L "$lib" "$T/bundle/lib/" ;;
  esac
done
# CUPTI, for JTOK_KERNEL_TRACE (src/cuda/kernel_trace.h: loaded with dlopen, so ldd does not list it):
# the build's own toolkit's, whose record layouts the trace was compiled against.
for cupti in /usr/local/cuda/lib64/libcupti.so.13 /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13; do
  if [ -f "$cupti" ]; then cp -L "$cupti" "$T/bundle/lib/"; break; fi
done
git rev-parse HEAD > "$T/bundle/commit" 2>/dev/null || true
# The CPU features the build's -march lets the compiler use, as /proc/cpuinfo names them, so the GPU
# host says which it lacks before anything runs (gpu_session.sh) instead of dying on an illegal
# instruction. The vector and bit-manipulation sets only: those a compiler emits on its own.
march=$(sed -n 's/^JTOK_MARCH:STRING=//p' "$B/CMakeCache.txt" 2>/dev/null); march=${march:-native}
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$B/CMakeCache.txt" 2>/dev/null); cxx=${cxx:-c++}
needs=$("$cxx" -march="$march" -dM -E -x c++ /dev/null 2>/dev/null | awk '
  BEGIN { split("AVX:avx AVX2:avx2 FMA:fma F16C:f16c BMI:bmi1 BMI2:bmi2 AVX512F:avx512f AVX512BW:avx512bw " \
                "AVX512DQ:avx512dq AVX512VL:avx512vl AVX512CD:avx512cd AVX512BF16:avx512_bf16 AVX512VNNI:avx512_vnni " \
                "AVX512VBMI:avx512vbmi AVX512VBMI2:avx512_vbmi2 AVX512IFMA:avx512ifma AVX512BITALG:avx512_bitalg " \
                "AVX512VPOPCNTDQ:avx512_vpopcntdq AVX512FP16:avx512_fp16 AVXVNNI:avx_vnni GFNI:gfni VAES:vaes " \
                "VPCLMULQDQ:vpclmulqdq", pairs, " ")
          for (i in pairs) { split(pairs[i], kv, ":"); flag["__" kv[1] "__"] = kv[2] } }
  $1 == "#define" && ($2 in flag) { print flag[$2] }' | sort | tr '\n' ' ')
printf 'march %s\nneeds %s\n' "$march" "$needs" > "$T/bundle/isa"
tar czf "$B/cuda-bundle.tar.gz" -C "$T" bundle
echo "cuda_bundle.sh: $B/cuda-bundle.tar.gz ($(du -h "$B/cuda-bundle.tar.gz" | cut -f1); $(ls "$T/bundle/lib" | wc -l) libraries;" \
     "-march=$march: $needs)"
