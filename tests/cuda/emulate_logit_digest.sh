#!/usr/bin/env bash
# Runs src/cuda/logit_digest.cu's kernel code on the CPU against logit_digest_ref (no GPU): the
# device code (the .cu's anonymous namespace) is extracted and compiled by g++ inside
# tests/cuda/emulate_logit_digest.cpp's shims. Keep the shims in step with what the kernel calls.
#   bash tests/cuda/emulate_logit_digest.sh            # V 1, 2, 40, 63, 64, 65, 1000, 5003, 20000
#   bash tests/cuda/emulate_logit_digest.sh 151936 16  # Qwen3's vocabulary (~75 s on 2 cores)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
python3 - "$ROOT/src/cuda/logit_digest.cu" "$T/kernel_body.inc" <<'PY'
import sys
s = open(sys.argv[1]).read()
a = s.index('namespace {')
b = s.index('}  // namespace\n', a) + len('}  // namespace\n')
open(sys.argv[2], 'w').write(s[a:b])
PY
g++ -std=c++20 -O2 -pthread -I"$ROOT/src" -I"$T" "$ROOT/tests/cuda/emulate_logit_digest.cpp" \
  "$ROOT/src/cuda/logit_digest_ref.cpp" -o "$T/emulate"
"$T/emulate" "$@"
