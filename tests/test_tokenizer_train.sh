#!/usr/bin/env bash
# `jtok tokenizer train` end to end: two runs give byte-identical files; a larger vocabulary
# compresses held-out text better; `jtok prepare --tokenizer-dir` makes shards with it; a model
# trains and evaluates on them with the config's tokenizer_dir (and is refused without it).
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
cd "$T"
fail() { echo "FAIL: $*"; exit 1; }
TRAIN=("$ROOT"/tests/data/corpus/model.md "$ROOT"/tests/data/corpus/jtok.md "$ROOT"/tests/data/corpus/scaling.md)
"$JTOK" tokenizer train --vocab-size 600 --out tok600 "${TRAIN[@]}" > train1.out
"$JTOK" tokenizer train --vocab-size 600 --out tok600b "${TRAIN[@]}" > train2.out
cmp tok600/encoder.json tok600b/encoder.json || fail "encoder.json differs between two runs"
cmp tok600/vocab.bpe tok600b/vocab.bpe || fail "vocab.bpe differs between two runs"
[ "$(head -n 1 tok600/vocab.bpe)" = "#version: 0.2" ] || fail "vocab.bpe header"
[ "$(($(wc -l < tok600/vocab.bpe) - 1))" = 343 ] || fail "expected 600 - 257 = 343 merges"
"$JTOK" tokenizer train --vocab-size 1200 --out tok1200 "${TRAIN[@]}" > /dev/null
# Held-out text: shards of docs/data.md with each tokenizer; fewer tokens with the larger vocabulary.
ntok() { "$JTOK" shard-info "$1" | /usr/bin/python3 -c 'import json, sys; print(sum(json.loads(l)["n_tokens"] for l in sys.stdin if l.startswith("{")))'; }
for v in 600 1200; do
  "$JTOK" prepare --tokenizer gpt2 --tokenizer-dir tok$v --out val$v "$ROOT"/tests/data/corpus/data.md > /dev/null
  "$JTOK" prepare --tokenizer gpt2 --tokenizer-dir tok$v --out train$v "${TRAIN[@]}" > /dev/null
done
n600=$(ntok val600); n1200=$(ntok val1200)
[ "$n1200" -lt "$n600" ] || fail "held-out tokens: vocab 1200 gives $n1200, vocab 600 gives $n600"
"$JTOK" shard-info val600 | grep -q '"vocab_size":600' || fail "shard vocab_size"
# Train and evaluate a tiny model on the shards of our tokenizer.
cat > cfg.json <<JSON
{ "vocab_size": 600, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 32, "max_position_embeddings": 32, "jtok": true,
  "seq_len": 32, "micro_batch_size": 2, "max_steps": 3, "learning_rate": 3e-3, "eval_interval": 3,
  "eval_batches": 1, "checkpoint_interval": 3, "sample_interval": 0, "tokenizer_dir": "tok600",
  "train_data": "train600", "val_data": "val600" }
JSON
OMP_NUM_THREADS=1 "$JTOK" train --config cfg.json --out run --peak-gflops 1 > run.out 2>&1 || { cat run.out; fail "training on our tokenizer's shards"; }
OMP_NUM_THREADS=1 "$JTOK" eval --checkpoint run --json --no-blimp > eval.json || fail "eval"
grep -q '"val_loss"' eval.json || fail "eval output: $(cat eval.json)"
# Without tokenizer_dir the default GPT-2 files do not match the shards: refused, naming the shard.
sed 's/"tokenizer_dir": "tok600",//; s/"vocab_size": 600/"vocab_size": 50257/' cfg.json > cfg_gpt2.json
if OMP_NUM_THREADS=1 "$JTOK" train --config cfg_gpt2.json --out run2 --peak-gflops 1 > run2.out 2>&1; then fail "GPT-2 tokenizer accepted our shards"; fi
grep -q "train600" run2.out || fail "error does not name the shard: $(tail -n 2 run2.out)"
echo "PASS: tokenizer train deterministic, compresses more with N, shards train and evaluate"
