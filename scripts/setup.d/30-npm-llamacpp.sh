#!/usr/bin/env bash
# Installs llama.cpp for the GGUF export test and bench (issue 13): node-llama-cpp@3.22.1 (JS
# bindings, pinned exactly) with its runtime dependencies and, of its optional prebuilt binaries,
# only @node-llama-cpp/linux-x64@3.22.1 (CPU; the variant is picked at run time), into
# .cache/npm/llamacpp (ignored by git), idempotently. Install scripts are not run: node-llama-cpp's
# postinstall would try to download or build llama.cpp; the prebuilt package is all we use.
# Too many dependencies (~100 packages) to fetch as single tarballs like 20-npm-data.sh, so npm
# installs the tree from the registry into a project-local prefix.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=.cache/npm/llamacpp
VER=3.22.1
[ -f "$DIR/.done-$VER" ] && { echo "30-npm-llamacpp: node-llama-cpp@$VER present in $DIR"; exit 0; }
command -v npm >/dev/null || { echo "30-npm-llamacpp: npm not found (scripts/setup.sh installs it)" >&2; exit 1; }
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) echo "30-npm-llamacpp: only linux-x64 is set up (found $(uname -s)-$(uname -m)); skipping" >&2; exit 0 ;;
esac
rm -rf "$DIR.tmp" && mkdir -p "$DIR.tmp"
echo '{"name": "jtok-llamacpp", "private": true}' > "$DIR.tmp/package.json"
npm install --prefix "$DIR.tmp" --no-audit --no-fund --silent --save-exact --ignore-scripts --omit=optional \
  "node-llama-cpp@$VER"
npm install --prefix "$DIR.tmp" --no-audit --no-fund --silent --save-exact --ignore-scripts --omit=optional \
  "@node-llama-cpp/linux-x64@$VER"
touch "$DIR.tmp/.done-$VER"
rm -rf "$DIR" && mv "$DIR.tmp" "$DIR"
echo "30-npm-llamacpp: node-llama-cpp@$VER (+ linux-x64 CPU binaries) installed in $DIR"
